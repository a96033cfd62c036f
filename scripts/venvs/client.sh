#!/usr/bin/env bash
# .venvs/client: the floor of the tito client's dependencies, for two jobs.
# - The stubs under tito/v1 are generated here (scripts/gen_protos.sh; tests/test_protos.py checks them) with
#   grpcio-tools 1.74.0, whose gencode (protobuf 6.31.1) runs on protobuf 6.31.1 and up, 7.x included: AReaL
#   1.0.4 resolves protobuf 6.33 (swanlab < 7), verl 0.9.1 protobuf 7.x. Stubs made by a newer grpcio-tools
#   refuse every older runtime.
# - .venvs/client/wheelhouse holds the client's own dependencies at that floor (grpcio, grpcio-health-checking,
#   protobuf), so tests/integrations/test_client_install.py installs the client's wheel into a fresh venv
#   offline (`pip install --no-index --find-links`).
# Idempotent: a stamp (hash of this script and pyproject.toml) skips the build when nothing changed.
# Env: TITO_PYTHON (interpreter, default python3.11 or python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${TITO_VENV_DIR:-.venvs/client}
stamp_of() { { cat "$0"; python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"])'; } | sha256sum | cut -c1-16; }
want=$(stamp_of)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.tito-stamp" 2>/dev/null)" = "$want" ]; then
    echo "[client] $venv is up to date (stamp $want)"
    exit 0
fi
py=${TITO_PYTHON:-$(command -v python3.11 || command -v python3)}
echo "[client] building $venv with $py"
rm -rf "$venv"
"$py" -m venv "$venv"
floor=("grpcio==1.74.0" "grpcio-health-checking==1.74.0" "protobuf==6.31.1")
"$venv/bin/python" -m pip install --no-input --progress-bar off "grpcio-tools==1.74.0" "${floor[@]}"
"$venv/bin/python" -m pip download --no-input --progress-bar off --dest "$venv/wheelhouse" "${floor[@]}"
"$venv/bin/python" -c "import grpc_tools.protoc, google.protobuf as p, grpc; print('[client] protobuf', p.__version__, 'grpcio', grpc.__version__)"
echo "$want" >"$venv/.tito-stamp"
echo "[client] $venv ready"
