#!/usr/bin/env bash
# .venvs/areal: AReaL 1.0.4's own code beside the tito client, for tests/integrations/test_areal.py and for
# trying tito.integrations.areal on a CPU machine (docs/integrations.md, "AReaL").
#
# AReaL is installed --no-deps: its requirements pin CUDA torch (< 2.11) and pull openhands, litellm[proxy], ray
# and dozens more that its rollout path (RemotevLLMEngine, WorkflowExecutor, RolloutWorkflow) never imports. What
# that path does import is listed below by hand, with torch's CPU build (a plain `pip install torch` pulls GBs of
# CUDA) and transformers inside AReaL's own pin (>= 5.0, <= 5.3.0). The tito client goes in last, without extras,
# and must leave that transformers alone (the point of issue 32).
#
# Idempotent: a stamp in the venv holds the hash of this script and pyproject.toml; a second run with the same
# inputs ends at once. Run by scripts/framework_venvs.sh (setup); alone: bash scripts/venvs/areal.sh
# Env: TITO_PYTHON (interpreter the venv is made from; default python3.11, else python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${TITO_VENV_DIR:-.venvs/areal}
stamp_of() { { cat scripts/venvs/areal.sh; python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"])'; } | sha256sum | cut -d' ' -f1; }
want=$(stamp_of)
if [ -f "$VENV/.stamp" ] && [ "$(cat "$VENV/.stamp")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
    echo "[areal] $VENV is up to date"
    exit 0
fi
py=${TITO_PYTHON:-$(command -v python3.11 || command -v python3)}
echo "[areal] building $VENV with $py"
rm -rf "$VENV"
"$py" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --no-deps "areal==1.0.4"
# torch's CPU wheel (2.13.0+cpu); AReaL's declared torch < 2.11 is a CUDA-era pin its rollout code does not need.
"${pip[@]}" "torch==2.13.0"
# What `import areal.engine.vllm_remote` and `areal.infra.workflow_executor` import (found by importing them;
# ray and numba are imported at module level by AReaL's infra), pinned to the versions checked here.
"${pip[@]}" "transformers>=5.0,<=5.3.0" "aiohttp==3.14.5" "aiofiles==25.1.0" "colorlog==6.12.0" "einops==0.8.2" \
    "flask==3.1.3" "omegaconf==2.4.0.dev2" "hydra-core==1.4.0.dev1" "lark==1.3.1" "numba==0.68.1" "openai==3.57.0" \
    "orjson==3.13.0" "pillow==13.0.0" "ray==2.60.0" "tenacity==9.2.1" "torchdata==0.11.0" "uvloop==0.23.0"
# The tito client alone: gRPC only. It must not move AReaL's transformers (checked just below).
"${pip[@]}" .
"$VENV/bin/python" - <<'EOF'
import transformers, torch
from packaging.version import Version
assert Version(transformers.__version__) <= Version("5.3.0"), f"transformers {transformers.__version__} is over AReaL's pin"
assert "+cpu" in torch.__version__, f"torch {torch.__version__} is not the CPU build"
import areal.engine.vllm_remote, areal.infra.workflow_executor, tito.client, tito.rollout  # noqa: F401
print(f"[areal] ok: areal, torch {torch.__version__}, transformers {transformers.__version__}, tito client")
EOF
echo "$want" >"$VENV/.stamp"
