#!/usr/bin/env bash
# .venvs/verl: verl 0.9.1 CPU-only beside the tito client (`pip install .`, gRPC only), for
# tests/integrations/test_verl.py. torch goes in first as the CPU wheel (a plain `torch` requirement would pull
# the CUDA build); verl's own pins then keep their transformers (< 5.11). Idempotent: a stamp (hash of this
# script and the client's dependencies in pyproject.toml) skips the build when nothing changed.
# Env: TITO_PYTHON (interpreter, default python3.11 or python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${TITO_VENV_DIR:-.venvs/verl}
stamp_of() { { cat "$0"; python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"])'; } | sha256sum | cut -c1-16; }
want=$(stamp_of)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.tito-stamp" 2>/dev/null)" = "$want" ]; then
    echo "[verl] $venv is up to date (stamp $want)"
    exit 0
fi
py=${TITO_PYTHON:-$(command -v python3.11 || command -v python3)}
echo "[verl] building $venv with $py"
rm -rf "$venv"
"$py" -m venv "$venv"
pip() { "$venv/bin/python" -m pip install --no-input --progress-bar off "$@"; }

# CPU torch first: verl and tensordict accept it, so pip keeps it instead of resolving a CUDA build.
pip "torch==2.13.0"
# verl 0.9.1 plus the modules its agent-loop layer imports that its metadata leaves out.
pip "verl==0.9.1" "transformers<5.11" cachetools fastapi uvicorn pyzmq msgspec
# The tito client alone (no extras): it must not move verl's transformers.
pip .
"$venv/bin/python" - <<'PY'
import torch, transformers, verl, tito.client  # noqa: F401  (the venv is usable only if these import)
from verl.experimental.agent_loop.agent_loop import AgentLoopBase  # noqa: F401
major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
assert (major, minor) < (5, 11), f"transformers {transformers.__version__} is not verl's (< 5.11)"
print(f"[verl] verl {verl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")
PY
echo "$want" >"$venv/.tito-stamp"
echo "[verl] $venv ready"
