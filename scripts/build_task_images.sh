#!/usr/bin/env bash
# Builds a task image per task folder, offline, FROM the sandbox image (sandbox_images/task/Dockerfile):
#   tito-task-<folder name>:${TITO_TASK_IMAGE_TAG:-latest}
# and/or the same task's root filesystem for the bwrap backend, from the same prepared context and recipe
# (env_server/sandbox/bwrap/rootfs_build.py task), without Docker.
# A task folder holds repo/ (the repository; .git is left out), hidden/ (hidden tests: checked to be absent
# from repo/, never copied into the image) and optionally requirements.txt (installed for the image's Python by
# the host's pip into the image's /opt/tito-task/site, binary wheels only).
#
# Usage: scripts/build_task_images.sh [TASK_DIR ...]   (default: every folder of examples/coding_tasks with a task.json)
# Env:   TITO_SANDBOX_IMAGE    the image to build on (tito-sandbox-python:latest)
#        TITO_TASK_IMAGE_TAG   the tag of the task images (latest)
#        TITO_TASK_TARGETS     "image" (default), "rootfs" (what TITO_SANDBOX_BACKEND=bwrap means), or "image rootfs"
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[tasks] %s\n' "$*"; }
die() { printf '[tasks] ERROR: %s\n' "$*" >&2; exit 1; }

SANDBOX_IMAGE=${TITO_SANDBOX_IMAGE:-tito-sandbox-python:latest}
TAG=${TITO_TASK_IMAGE_TAG:-latest}
if [ "${TITO_SANDBOX_BACKEND:-docker}" = bwrap ]; then TARGETS=${TITO_TASK_TARGETS:-rootfs}; else TARGETS=${TITO_TASK_TARGETS:-image}; fi
want() { [[ " $TARGETS " == *" $1 "* ]]; }
ROOTFS_BUILD=(.venv/bin/python -m env_server.sandbox.bwrap.rootfs_build)
[ "${TITO_FORCE_ROOTFS:-0}" = 1 ] && ROOTFS_BUILD+=(--force)
if [ -x .venv/bin/python ]; then PIP=${TITO_PIP:-.venv/bin/python -m pip}; else PIP=${TITO_PIP:-python3 -m pip}; fi

tasks=("$@")
if [ ${#tasks[@]} -eq 0 ]; then
    for d in examples/coding_tasks/*/; do [ -f "$d/task.json" ] && tasks+=("${d%/}"); done
fi
[ ${#tasks[@]} -gt 0 ] || die "no task folders"
if want image; then
    docker image inspect "$SANDBOX_IMAGE" >/dev/null 2>&1 || die "$SANDBOX_IMAGE is missing: build it first (scripts/build_images.sh sandbox)"
fi
if want rootfs; then
    "${ROOTFS_BUILD[@]}" check "$SANDBOX_IMAGE" >/dev/null || die "$SANDBOX_IMAGE has no root filesystem: build it first (scripts/build_rootfs.sh sandbox)"
fi
python_version() {  # the sandbox's Python, from its image or else its root filesystem
    if want image; then
        docker run --rm --network none --entrypoint python3 "$SANDBOX_IMAGE" -c 'import sys; print("%d.%d" % sys.version_info[:2])'
    else
        "${ROOTFS_BUILD[@]}" python-version "$SANDBOX_IMAGE"
    fi
}

for dir in "${tasks[@]}"; do
    dir=${dir%/}
    name=$(basename "$dir")
    image="tito-task-$name:$TAG"
    [ -d "$dir/repo" ] || die "$dir has no repo/ folder"
    [[ "$name" =~ ^[a-z0-9][a-z0-9_.-]*$ ]] || die "task folder name '$name' is not a valid image name (lower case, digits, . _ -)"
    ctx=.build/task/$name
    rm -rf "$ctx" && mkdir -p "$ctx/repo" "$ctx/site"
    # The repository without its history; caches left out.
    tar -C "$dir/repo" --exclude=.git --exclude=__pycache__ --exclude='*.pyc' -cf - . | tar -C "$ctx/repo" -xf -
    if [ -d "$dir/hidden" ]; then
        while IFS= read -r -d '' f; do
            rel=${f#"$dir/hidden/"}
            [ ! -e "$ctx/repo/$rel" ] || die "$dir: the hidden file $rel is also in repo/: hidden tests must not be in the image"
        done < <(find "$dir/hidden" -type f -print0)
    fi
    if [ -s "$dir/requirements.txt" ]; then
        pyver=$(python_version) || die "cannot run python3 in $SANDBOX_IMAGE"
        log "$name: installing requirements.txt for Python $pyver (host pip, binary wheels)"
        $PIP install --quiet --disable-pip-version-check --no-warn-conflicts --target "$ctx/site" \
            --python-version "$pyver" --implementation cp --only-binary=:all: \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -r "$dir/requirements.txt" || die "pip could not install $dir/requirements.txt"
        rm -rf "$ctx/site/bin"
    fi
    chmod -R a+rX,go-w "$ctx"  # readable by the sandbox user, without a second layer in the image
    if want image; then
        start=$SECONDS
        logf=$(mktemp "${TMPDIR:-/tmp}/tito-task-build.XXXXXX")
        if ! DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-0} docker build -t "$image" --build-arg "SANDBOX_IMAGE=$SANDBOX_IMAGE" \
                -f sandbox_images/task/Dockerfile "$ctx" >"$logf" 2>&1; then
            tail -n 40 "$logf" >&2
            die "building $image failed (full log: $logf)"
        fi
        rm -f "$logf"
        log "$image ready ($((SECONDS - start)) s)"
    fi
    if want rootfs; then
        "${ROOTFS_BUILD[@]}" task "$ctx" --image "$image" --from "$SANDBOX_IMAGE" || die "building the root filesystem of $image failed"
    fi
done
