#!/usr/bin/env bash
# Makes a Debian base image (python3 3.11 included) from Debian's packages, for machines that reach
# Debian's mirror but no container registry:
#   debootstrap --variant=minbase --include=python3 bookworm ROOTFS $MIRROR ; tar -C ROOTFS -c . | docker import
#
# Usage: scripts/bootstrap_base_image.sh [TAG]        (default tag: tito-base:bookworm)
# Env:   TITO_DEBIAN_SUITE (bookworm), TITO_DEBIAN_MIRROR (http://deb.debian.org/debian),
#        TITO_FORCE_BOOTSTRAP=1 to rebuild an existing image.
# Idempotent: does nothing when the image already exists. Needs root (debootstrap) and a Docker daemon.
set -euo pipefail

TAG=${1:-${TITO_BOOTSTRAP_TAG:-tito-base:bookworm}}
SUITE=${TITO_DEBIAN_SUITE:-bookworm}
MIRROR=${TITO_DEBIAN_MIRROR:-http://deb.debian.org/debian}

log() { printf '[bootstrap] %s\n' "$*"; }
die() { printf '[bootstrap] ERROR: %s\n' "$*" >&2; exit 1; }

docker info >/dev/null 2>&1 || die "no Docker daemon reachable (run scripts/setup.sh first)"

if [ "${TITO_FORCE_BOOTSTRAP:-0}" != 1 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
    log "image $TAG already exists; nothing to do (TITO_FORCE_BOOTSTRAP=1 rebuilds it)"
    exit 0
fi

[ "$(id -u)" = 0 ] || die "debootstrap needs root; run as root or import a base image yourself"

if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq debootstrap >/dev/null
fi

ROOTFS=$(mktemp -d "${TMPDIR:-/var/tmp}/tito-rootfs.XXXXXX")
cleanup() {
    # debootstrap mounts /proc and /sys inside the target; never rm -rf through a live mount.
    local m
    for m in $(awk -v r="$ROOTFS" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
    if ! awk -v r="$ROOTFS" 'index($2, r) == 1 {found=1} END {exit !found}' /proc/mounts; then
        rm -rf "$ROOTFS"
    else
        printf '[bootstrap] WARNING: mounts left under %s; not removing it\n' "$ROOTFS" >&2
    fi
}
trap cleanup EXIT

log "debootstrap --variant=minbase --include=python3 $SUITE $ROOTFS $MIRROR (about a minute)"
start=$SECONDS
if ! debootstrap --variant=minbase --include=python3 "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1; then
    tail -n 30 "$ROOTFS.log" >&2
    die "debootstrap failed (full log: $ROOTFS.log)"
fi
rm -f "$ROOTFS.log"
log "debootstrap done in $((SECONDS - start)) s"

# Slim it down; keep /etc/apt/sources.list so Dockerfiles can still apt-get install over http.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/log/* \
       "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/*
[ -s "$ROOTFS/etc/apt/sources.list" ] || echo "deb $MIRROR $SUITE main" >"$ROOTFS/etc/apt/sources.list"
[ -x "$ROOTFS/usr/bin/python3" ] || die "python3 missing in the rootfs"

log "docker import -> $TAG"
tar --numeric-owner -C "$ROOTFS" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "debootstrap --variant=minbase --include=python3 $SUITE ($MIRROR)" \
    - "$TAG" >/dev/null
docker run --rm --network none "$TAG" python3 -c 'import sys; print("[bootstrap] python", sys.version.split()[0], "in", sys.argv[1])' "$TAG"
log "done in $((SECONDS - start)) s"
