#!/usr/bin/env bash
# Builds the bwrap backend's root filesystems without Docker (env_server/sandbox/bwrap/rootfs_build.py does the
# work; a re-run skips what is current and takes a second or two, but still takes write permission for group and
# others off current trees built before the builder did: the server refuses a tree others than root may write):
#   base        Debian bookworm with python3: debootstrap (root), the same base scripts/bootstrap_base_image.sh
#               gives Docker; or, without root, TITO_ROOTFS_FROM_TAR=FILE (a tarball of such a tree made elsewhere)
#   sandbox     tito-sandbox-python:latest      sandbox_images/python/Dockerfile's recipe on the base
#   scientific  tito-sandbox-scientific:latest  + numpy, scipy, sympy, pandas, matplotlib (scripts/scientific_site.sh)
#   tasks       the example coding tasks' root filesystems (scripts/build_task_images.sh, as for their images)
#   export IMAGE  a built Docker image's root filesystem, exactly (for images with no recipe here)
#
# Usage: scripts/build_rootfs.sh [base] [sandbox] [scientific] [tasks] | export IMAGE
#        (default: base sandbox scientific tasks)
# Env:   TITO_ROOTFS_DIR      where they go (default /var/lib/tito/rootfs as root, ~/.cache/tito/rootfs otherwise;
#                             servers look in the same place, or in sandbox.bwrap.rootfs_dir)
#        TITO_FORCE_ROOTFS=1  rebuild what is current
#        TITO_ROOTFS_FROM_TAR the base from this tarball instead of debootstrap
#        TITO_BUILD_PYTHON    the builder's interpreter (default .venv/bin/python, else python3 >= 3.11: base and
#                             sandbox need only the standard library)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[rootfs] %s\n' "$*"; }
die() { printf '[rootfs] ERROR: %s\n' "$*" >&2; exit 1; }

# shellcheck source=scripts/build_python.sh
. scripts/build_python.sh
command -v bwrap >/dev/null 2>&1 || die "bwrap not found: apt-get install bubblewrap (TITO_SANDBOX_BACKEND=bwrap scripts/setup.sh does)"
build=("$BUILD_PYTHON" -m env_server.sandbox.bwrap.rootfs_build)
[ "${TITO_FORCE_ROOTFS:-0}" = 1 ] && build+=(--force)

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(base sandbox scientific tasks)
while [ ${#targets[@]} -gt 0 ]; do
    t=${targets[0]}
    targets=("${targets[@]:1}")
    start=$SECONDS
    case "$t" in
        base)
            if [ -n "${TITO_ROOTFS_FROM_TAR:-}" ]; then
                "${build[@]}" base --from-tar "$TITO_ROOTFS_FROM_TAR"
            else
                command -v debootstrap >/dev/null 2>&1 || die "debootstrap not found: apt-get install debootstrap, or set TITO_ROOTFS_FROM_TAR"
                "${build[@]}" base
            fi
            ;;
        sandbox) "${build[@]}" sandbox --dockerfile sandbox_images/python/Dockerfile ;;
        scientific)
            pyver=$("${build[@]}" python-version tito-sandbox-python:latest) || die "no sandbox root filesystem: build 'sandbox' first"
            site=$(bash scripts/scientific_site.sh "$pyver")
            "${build[@]}" scientific --site "$site"
            ;;
        tasks) TITO_TASK_TARGETS=rootfs bash scripts/build_task_images.sh ;;
        export)
            [ ${#targets[@]} -gt 0 ] || die "export needs an image name"
            "${build[@]}" export "${targets[0]}"
            targets=("${targets[@]:1}")
            ;;
        *) die "unknown target '$t' (base, sandbox, scientific, tasks, export IMAGE)" ;;
    esac
    log "$t done ($((SECONDS - start)) s)"
done
