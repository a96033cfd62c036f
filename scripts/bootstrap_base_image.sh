#!/usr/bin/env bash
# Makes a Debian base image (python3 3.11 included) from Debian's packages, for machines that reach
# Debian's mirror but no container registry. The tree is the bwrap backend's base root filesystem too
# (env_server/sandbox/bwrap/rootfs_build.py base: debootstrap --variant=minbase --include=python3, slimmed),
# so a machine that runs both backends bootstraps once:
#   rootfs_build base  ->  <rootfs dir>/base-bookworm/root  ->  tar | docker import
#
# Usage: scripts/bootstrap_base_image.sh [TAG]        (default tag: tito-base:bookworm)
# Env:   TITO_DEBIAN_SUITE (bookworm), TITO_DEBIAN_MIRROR (http://deb.debian.org/debian), TITO_ROOTFS_DIR,
#        TITO_FORCE_BOOTSTRAP=1 to rebuild an existing image.
#        TITO_BUILD_PYTHON: the interpreter that runs the builder (default .venv/bin/python, else python3 >= 3.11;
#        the builder needs only the standard library, so setup runs this beside pip install).
# Idempotent: does nothing when the image already exists. Needs root (debootstrap) and a Docker daemon.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${1:-${TITO_BOOTSTRAP_TAG:-tito-base:bookworm}}
SUITE=${TITO_DEBIAN_SUITE:-bookworm}

log() { printf '[bootstrap] %s\n' "$*"; }
die() { printf '[bootstrap] ERROR: %s\n' "$*" >&2; exit 1; }

docker info >/dev/null 2>&1 || die "no Docker daemon reachable (run scripts/setup.sh first)"

if [ "${TITO_FORCE_BOOTSTRAP:-0}" != 1 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
    log "image $TAG already exists; nothing to do (TITO_FORCE_BOOTSTRAP=1 rebuilds it)"
    exit 0
fi

[ "$(id -u)" = 0 ] || die "debootstrap needs root; run as root or import a base image yourself"
# shellcheck source=scripts/build_python.sh
. scripts/build_python.sh

if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq debootstrap >/dev/null
fi

start=$SECONDS
build=("$BUILD_PYTHON" -m env_server.sandbox.bwrap.rootfs_build)
[ "${TITO_FORCE_BOOTSTRAP:-0}" = 1 ] && build+=(--force)
"${build[@]}" base --name "base-$SUITE" --suite "$SUITE"
tree="$("$BUILD_PYTHON" -c 'from env_server.sandbox.bwrap import rootfs; print(rootfs.default_rootfs_dir())')/base-$SUITE/root"
[ -x "$tree/usr/bin/python3" ] || die "python3 missing in $tree"

log "docker import $tree -> $TAG"
tar --numeric-owner -C "$tree" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "debootstrap --variant=minbase --include=python3 $SUITE" \
    - "$TAG" >/dev/null
docker run --rm --network none "$TAG" python3 -c 'import sys; print("[bootstrap] python", sys.version.split()[0], "in", sys.argv[1])' "$TAG"
log "done in $((SECONDS - start)) s"
