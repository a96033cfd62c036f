#!/usr/bin/env bash
# The demo: setup, start the environment server, run the main job against it.
#
#   ./scripts/demo.sh            # environment via `docker compose up -d --wait`, left running afterwards
#   ./scripts/demo.sh --down     # ... and `docker compose down` at the end
#   ./scripts/demo.sh --local    # server as a local process (.venv/bin/python -m env_server), stopped at the end
#   TITO_SANDBOX_BACKEND=bwrap ./scripts/demo.sh   # no Docker at all: bubblewrap sandboxes, a local server
#
# Main job: `python -m trainer --config examples/demo.yaml --output-dir runs/demo` once the trainer
# exists (trainer/__main__.py and examples/demo.yaml), else examples/scripted_session.py (a scripted
# client: list environments, open a python session, step with tool calls, close).
#
# Cleanup: with compose the server is LEFT RUNNING (restart: unless-stopped) so you can keep poking at
# it on 127.0.0.1:${TITO_PORT:-50051}; stop it with `docker compose down` or pass --down. Re-running the
# demo reuses it (compose recreates it only when the image or config changed). The --local server is
# always stopped when the demo ends. Compose is used when `docker compose` works, else --local.
# Env: TITO_PORT (50051), TITO_METRICS_PORT (9464), TITO_DEMO_MODE=compose|local, TITO_SANDBOX_BACKEND=docker|bwrap,
#      TITO_DEMO_JOB=scripted (run the scripted client session even when the trainer is there),
#      TITO_SETUP_PROFILE (demo: set up only what the demo needs; full: everything, as scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=${TITO_DEMO_MODE:-compose}
DOWN=0
for a in "$@"; do
    case "$a" in
        --down) DOWN=1 ;;
        --local) MODE=local ;;
        --compose) MODE=compose ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "[demo] unknown argument '$a' (see --help)" >&2; exit 2 ;;
    esac
done
log() { printf '[demo] %s\n' "$*"; }
die() { printf '[demo] ERROR: %s\n' "$*" >&2; exit 1; }

PORT=${TITO_PORT:-50051}
TARGET=127.0.0.1:$PORT
DEMO_T0=$SECONDS
mkdir -p runs/demo
if [ "${TITO_SANDBOX_BACKEND:-docker}" = bwrap ]; then
    # setup.sh reads TITO_SANDBOX_BACKEND; the server reads its config's name for it.
    export TITO_SANDBOX_BACKEND TITO_SANDBOX__BACKEND=bwrap
    MODE=local
fi

# Only what the demo runs (setup's demo profile: no vLLM, no scientific or task images); scripts/test.sh sets up the rest.
export TITO_SETUP_PROFILE=${TITO_SETUP_PROFILE:-demo}
if [ "$MODE" = local ]; then
    TITO_SKIP_SERVER_IMAGE=1 bash scripts/setup.sh
else
    bash scripts/setup.sh
fi
SETUP_S=$((SECONDS - DEMO_T0))
# shellcheck disable=SC1091
[ -f .build/setup.env ] && . .build/setup.env
export TITO_BASE_IMAGE COMPOSE_BAKE=false
if [ "$MODE" = compose ] && ! docker compose version >/dev/null 2>&1; then
    log "docker compose is not available; running the server as a local process instead"
    MODE=local
fi

serving() {  # is a server SERVING at $TARGET?
    .venv/bin/python -m env_server.healthcheck "$TARGET" >/dev/null 2>&1
}

SERVER_PID=
stop_local() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        log "stopping the local server (pid $SERVER_PID)"
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
}

if [ "$MODE" = compose ]; then
    log "docker compose up -d --wait   (server on $TARGET, metrics on 127.0.0.1:${TITO_METRICS_PORT:-9464})"
    if ! docker compose up -d --wait --wait-timeout 180; then
        docker compose ps || true
        docker compose logs --tail 60 env-server || true
        die "the environment server did not become healthy"
    fi
    docker compose ps
else
    if serving; then
        die "something already serves on $TARGET (a compose server? stop it with 'docker compose down', or set TITO_PORT)"
    fi
    log "starting .venv/bin/python -m env_server --port $PORT --server-name demo, ${TITO_SANDBOX__BACKEND:-docker} sandboxes (log: runs/demo/env_server.log)"
    .venv/bin/python -m env_server --port "$PORT" --server-name demo >runs/demo/env_server.log 2>&1 &
    SERVER_PID=$!
    trap stop_local EXIT
    for _ in $(seq 1 120); do
        serving && break
        kill -0 "$SERVER_PID" 2>/dev/null || { tail -n 40 runs/demo/env_server.log >&2; die "the server exited"; }
        sleep 0.5
    done
    serving || { tail -n 40 runs/demo/env_server.log >&2; die "the server did not report SERVING within 60 s"; }
    log "server SERVING on $TARGET"
fi

if [ -x .venv/bin/grpcurl ]; then  # TITO_INSTALL_GRPCURL=1 scripts/setup.sh puts it there
    log "grpcurl -plaintext $TARGET list"
    .venv/bin/grpcurl -plaintext "$TARGET" list || true
fi

export TITO_ENV_TARGET=$TARGET
SERVER_S=$((SECONDS - DEMO_T0 - SETUP_S))
JOB_T0=$SECONDS
rc=0
if [ "${TITO_DEMO_JOB:-auto}" != scripted ] && [ -f trainer/__main__.py ] && [ -f examples/demo.yaml ]; then
    log "main job: .venv/bin/python -m trainer --config examples/demo.yaml --output-dir runs/demo --env-address $TARGET"
    .venv/bin/python -m trainer --config examples/demo.yaml --output-dir runs/demo --env-address "$TARGET" || rc=$?
else
    log "main job: examples/scripted_session.py --target $TARGET"
    .venv/bin/python examples/scripted_session.py --target "$TARGET" || rc=$?
fi

if [ "$MODE" = compose ]; then
    if [ "$DOWN" = 1 ]; then
        log "docker compose down"
        docker compose down
    else
        log "the environment server is left running on $TARGET; stop it with: docker compose down"
    fi
fi
log "times: setup ${SETUP_S} s, server up ${SERVER_S} s, main job $((SECONDS - JOB_T0)) s; ${SECONDS} s in all"
[ "$rc" = 0 ] && log "demo finished OK" || log "demo FAILED (exit $rc)"
exit "$rc"
