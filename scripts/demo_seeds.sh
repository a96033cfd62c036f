#!/usr/bin/env bash
# The demo (examples/demo.yaml) for several seeds, then the mean reward of the first and the last
# 5 GRPO steps of each. Each seed draws its own puzzle pool, model init and samples.
#
#   ./scripts/demo_seeds.sh               # seeds 0 1 2
#   ./scripts/demo_seeds.sh 3 4           # other seeds
#   ./scripts/demo_seeds.sh --config examples/demo_vllm.yaml [SEEDS]   # the demo on the vLLM backend
#
# Uses the env server at 127.0.0.1:${TITO_PORT:-50051} if one is SERVING there, else starts a local
# one (.venv/bin/python -m env_server) and stops it at the end. Needs `scripts/setup.sh` done first
# (./scripts/demo.sh does it). Outputs, NAME being the config's file name without .yaml (demo by default):
# runs/NAME_seed<S>/ (metrics.jsonl, metrics.png, ...) and runs/NAME_seeds.png (every seed's reward curve
# and their mean; docs/img/demo_reward.png is a copy of runs/demo_seeds.png).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=examples/demo.yaml
if [ "${1:-}" = --config ]; then CONFIG=$2; shift 2; fi
[ -f "$CONFIG" ] || { echo "[demo_seeds] no config file $CONFIG" >&2; exit 2; }
NAME=$(basename "$CONFIG" .yaml)
SEEDS=("$@")
[ ${#SEEDS[@]} -gt 0 ] || SEEDS=(0 1 2)
PORT=${TITO_PORT:-50051}
TARGET=127.0.0.1:$PORT
log() { printf '[demo_seeds] %s\n' "$*"; }
# TITO_SANDBOX_BACKEND=bwrap: the local server runs bubblewrap sandboxes (no Docker).
if [ "${TITO_SANDBOX_BACKEND:-docker}" = bwrap ]; then export TITO_SANDBOX__BACKEND=bwrap; fi

serving() { .venv/bin/python -m env_server.healthcheck "$TARGET" >/dev/null 2>&1; }
SERVER_PID=
stop_local() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
}
mkdir -p runs
if serving; then
    log "using the env server SERVING on $TARGET"
else
    log "starting a local env server on $TARGET (log: runs/demo_seeds_env_server.log)"
    .venv/bin/python -m env_server --port "$PORT" --metrics-port 0 --server-name demo-seeds \
        >runs/demo_seeds_env_server.log 2>&1 &
    SERVER_PID=$!
    trap stop_local EXIT
    for _ in $(seq 1 120); do serving && break; sleep 0.5; done
    serving || { tail -n 40 runs/demo_seeds_env_server.log >&2; log "the server did not start"; exit 1; }
fi

for s in "${SEEDS[@]}"; do
    log "seed $s: python -m trainer --config $CONFIG --set seed=$s --output-dir runs/${NAME}_seed$s"
    start=$(date +%s)
    .venv/bin/python -m trainer --config "$CONFIG" --env-address "$TARGET" \
        --set seed="$s" --set progress=false --output-dir "runs/${NAME}_seed$s"
    echo "$(( $(date +%s) - start ))" >"runs/${NAME}_seed$s/wall_s"
done

RUNS=()
for s in "${SEEDS[@]}"; do RUNS+=("runs/${NAME}_seed$s"); done
.venv/bin/python -m trainer.seeds_report "${RUNS[@]}" --plot "runs/${NAME}_seeds.png" \
    --title "$CONFIG, seeds ${SEEDS[*]}"
