#!/usr/bin/env bash
# Builds tito's images on the local Docker daemon (docker build; Docker's layer cache makes a re-run
# take a second or two):
#   tito-sandbox-python:latest   sandbox_images/python/Dockerfile, context . (the server starts sandboxes from it)
#   tito-env-server:latest       env_server/Dockerfile      (what compose.yaml runs)
#   tito-sandbox-scientific:latest  sandbox_images/scientific/Dockerfile: the sandbox image plus numpy,
#                                scipy, sympy, pandas, matplotlib, installed for the image's Python with the
#                                host's pip into .build/scientific/site (scripts/scientific_site.sh: kept;
#                                redone when the requirements or the Python change)
#
# Usage: scripts/build_images.sh [sandbox] [server] [scientific] [tasks]   (default: the first three, in that order)
#        tasks: the example coding tasks' images (scripts/build_task_images.sh)
# Env:   TITO_BASE_IMAGE     base of both images (default: what scripts/setup.sh chose, recorded in
#                            .build/setup.env, else python:3.12-slim)
#        TITO_SERVER_IMAGE   tag of the server image (tito-env-server:latest)
#        TITO_SANDBOX_IMAGE  tag of the sandbox image (tito-sandbox-python:latest)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[build] %s\n' "$*"; }
die() { printf '[build] ERROR: %s\n' "$*" >&2; exit 1; }

if [ -z "${TITO_BASE_IMAGE:-}" ] && [ -f .build/setup.env ]; then
    # shellcheck disable=SC1091
    . .build/setup.env
fi
BASE=${TITO_BASE_IMAGE:-python:3.12-slim}
SANDBOX_IMAGE=${TITO_SANDBOX_IMAGE:-tito-sandbox-python:latest}
SERVER_IMAGE=${TITO_SERVER_IMAGE:-tito-env-server:latest}
SCIENTIFIC_IMAGE=${TITO_SCIENTIFIC_IMAGE:-tito-sandbox-scientific:latest}

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(sandbox server scientific)

docker info >/dev/null 2>&1 || die "no Docker daemon reachable (run scripts/setup.sh)"
docker image inspect "$BASE" >/dev/null 2>&1 || die "base image $BASE is missing: run scripts/setup.sh, or
  scripts/bootstrap_base_image.sh and TITO_BASE_IMAGE=tito-base:bookworm, or docker pull $BASE"

# pip inside the server build trusts the host's CA bundle (TLS-intercepting proxies); the Dockerfile
# uses .build/ca-certificates.crt when present, and it never reaches the final image.
ca_bundle() {
    local f
    for f in "${PIP_CERT:-}" "${SSL_CERT_FILE:-}" "${REQUESTS_CA_BUNDLE:-}" /etc/ssl/certs/ca-certificates.crt; do
        if [ -n "$f" ] && [ -s "$f" ]; then echo "$f"; return 0; fi
    done
    return 1
}

# The server image's dependencies from the wheels this host already has (pip's cache, filled when .venv was
# installed): `pip download` of the same versions as .venv into .build/server-wheels, which the Dockerfile
# installs with --no-index. Only when the base image's Python is .venv's (same wheel tags); otherwise, and
# without .venv, the Dockerfile installs from the index as before. Redone when the pins change.
server_wheels() {
    local dir=.build/server-wheels base_py venv_py want
    rm -rf "$dir.tmp"
    if [ ! -x .venv/bin/python ]; then rm -rf "$dir"; return 0; fi
    base_py=$(docker run --rm --network none --entrypoint python3 "$BASE" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || base_py=none
    venv_py=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$base_py" != "$venv_py" ]; then
        log "server image: base Python $base_py is not .venv's $venv_py; its dependencies come from the index"
        rm -rf "$dir"; return 0
    fi
    # The server's requirements pinned to what .venv has (pip freeze as constraints; not the project itself).
    .venv/bin/python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['server']))" >.build/server-requirements.txt
    .venv/bin/python -m pip freeze --exclude-editable --disable-pip-version-check | grep -v ' @ ' >.build/server-constraints.txt || true
    want=$(cat .build/server-requirements.txt .build/server-constraints.txt | sha256sum | cut -c1-16)
    if [ "$(cat "$dir/.pins" 2>/dev/null)" = "$want" ]; then return 0; fi
    local start=$SECONDS
    if ! .venv/bin/python -m pip download --quiet --disable-pip-version-check --only-binary=:all: -d "$dir.tmp" \
            -r .build/server-requirements.txt -c .build/server-constraints.txt >.build/server-wheels.log 2>&1; then
        log "server image: pip download from the host's cache failed (.build/server-wheels.log); the image installs from the index"
        rm -rf "$dir" "$dir.tmp"; return 0
    fi
    echo "$venv_py" >"$dir.tmp/.python"
    echo "$want" >"$dir.tmp/.pins"
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
    log "server image: $(find "$dir" -name '*.whl' | wc -l) wheels of .venv's versions in $dir ($((SECONDS - start)) s)"
}

run_build() {  # tag, then docker build args
    local tag=$1 start=$SECONDS logf
    shift
    logf=$(mktemp "${TMPDIR:-/tmp}/tito-build.XXXXXX")
    log "docker build -t $tag --build-arg BASE_IMAGE=$BASE $*"
    if ! DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-0} docker build -t "$tag" --build-arg "BASE_IMAGE=$BASE" "$@" >"$logf" 2>&1; then
        tail -n 40 "$logf" >&2
        die "building $tag failed (full log: $logf)"
    fi
    rm -f "$logf"
    log "$tag ready ($((SECONDS - start)) s)"
}

for t in "${targets[@]}"; do
    case "$t" in
        sandbox)
            [ -f sandbox_images/python/Dockerfile ] || die "sandbox_images/python/Dockerfile is missing"
            run_build "$SANDBOX_IMAGE" -f sandbox_images/python/Dockerfile .
            ;;
        server)
            [ -f env_server/Dockerfile ] || die "env_server/Dockerfile is missing"
            mkdir -p .build
            if ca=$(ca_bundle); then
                cmp -s "$ca" .build/ca-certificates.crt 2>/dev/null || cp "$ca" .build/ca-certificates.crt
            else
                rm -f .build/ca-certificates.crt
            fi
            server_wheels
            run_build "$SERVER_IMAGE" -f env_server/Dockerfile .
            ;;
        scientific)
            [ -f sandbox_images/scientific/Dockerfile ] || die "sandbox_images/scientific/Dockerfile is missing"
            docker image inspect "$SANDBOX_IMAGE" >/dev/null 2>&1 || die "$SANDBOX_IMAGE is missing: build it first (scripts/build_images.sh sandbox)"
            pyver=$(docker run --rm --network none --entrypoint python3 "$SANDBOX_IMAGE" -c \
                'import sys; print("%d.%d" % sys.version_info[:2])') || die "cannot run python3 in $SANDBOX_IMAGE"
            site=$(bash scripts/scientific_site.sh "$pyver") || die "could not install the scientific packages"
            ctx=$(dirname "$site")
            # Its context is a few hundred MB of packages: sending it again takes ~10 s even when every layer is
            # cached, so a label records the inputs (the packages' stamp, the Dockerfile, the sandbox image) and an
            # image with the same label is kept.
            inputs=$( { cat "$ctx/stamp" sandbox_images/scientific/Dockerfile; docker image inspect -f '{{.Id}}' "$SANDBOX_IMAGE"; } | sha256sum | cut -c1-16)
            if [ "$(docker image inspect -f '{{index .Config.Labels "tito.inputs"}}' "$SCIENTIFIC_IMAGE" 2>/dev/null)" = "$inputs" ]; then
                log "$SCIENTIFIC_IMAGE up to date (inputs $inputs)"
                continue
            fi
            run_build "$SCIENTIFIC_IMAGE" --build-arg "SANDBOX_IMAGE=$SANDBOX_IMAGE" --label "tito.inputs=$inputs" \
                -f sandbox_images/scientific/Dockerfile "$ctx"
            ;;
        tasks)
            bash scripts/build_task_images.sh
            ;;
        *) die "unknown target '$t' (sandbox, server, scientific, tasks)" ;;
    esac
done
