#!/usr/bin/env bash
# .venvs/openenv: OpenEnv 0.10.0 (pure Python: its FastAPI app, uvicorn and GenericEnvClient) beside the tito
# client (`pip install .`, gRPC only), for tests/integrations/test_openenv.py and `python -m
# tito.integrations.openenv`. Idempotent: a stamp (hash of this script and pyproject.toml) skips the build when
# nothing changed.
# Env: TITO_PYTHON (interpreter, default python3.11 or python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${TITO_VENV_DIR:-.venvs/openenv}
stamp_of() { { cat "$0"; python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"])'; } | sha256sum | cut -c1-16; }
want=$(stamp_of)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.tito-stamp" 2>/dev/null)" = "$want" ]; then
    echo "[openenv] $venv is up to date (stamp $want)"
    exit 0
fi
py=${TITO_PYTHON:-$(command -v python3.11 || command -v python3)}
echo "[openenv] building $venv with $py"
rm -rf "$venv"
"$py" -m venv "$venv"
pip() { "$venv/bin/python" -m pip install --no-input --progress-bar off "$@"; }

pip "openenv==0.10.0"
# The tito client alone (no extras): it must leave OpenEnv's own dependencies as they are.
pip .
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
import openenv.core.env_server.interfaces  # noqa: F401  (the venv is usable only if these import)
import tito.client, tito.integrations.openenv  # noqa: F401,E401
for heavy in ("torch", "transformers", "docker"):
    try:
        md.version(heavy)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(f"[openenv] {heavy} got installed: the tito client must need only gRPC")
print(f"[openenv] openenv {md.version('openenv')}, protobuf {md.version('protobuf')}, grpcio {md.version('grpcio')}")
PY
echo "$want" >"$venv/.tito-stamp"
echo "[openenv] $venv ready"
