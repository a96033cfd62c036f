#!/usr/bin/env bash
# Builds the RL frameworks' own virtual environments (.venvs/NAME), one per scripts/venvs/NAME.sh, all at once:
# the integration tests (tests/integrations) run verl's, AReaL's and OpenEnv's own code there, beside a tito
# client installed with `pip install .` (gRPC only), never in the project's .venv.
# Each NAME.sh is idempotent (a stamp in its venv says what it was built from) and logs to .build/venv-NAME.log.
#   bash scripts/framework_venvs.sh            # all of them
#   bash scripts/framework_venvs.sh verl       # one
# Env: TITO_PYTHON (interpreter for the venvs, default python3.11 or python3).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .build .venvs
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for f in scripts/venvs/*.sh; do [ -e "$f" ] && names+=("$(basename "$f" .sh)"); done
fi
[ ${#names[@]} -gt 0 ] || { echo "[venvs] no scripts/venvs/*.sh"; exit 0; }
declare -A pids starts
for n in "${names[@]}"; do
    [ -f "scripts/venvs/$n.sh" ] || { echo "[venvs] ERROR: no scripts/venvs/$n.sh" >&2; exit 2; }
    starts[$n]=$SECONDS
    bash "scripts/venvs/$n.sh" >".build/venv-$n.log" 2>&1 &
    pids[$n]=$!
done
rc=0
for n in "${names[@]}"; do
    if wait "${pids[$n]}"; then
        echo "[venvs] .venvs/$n ready ($((SECONDS - ${starts[$n]})) s; log .build/venv-$n.log)"
    else
        rc=1
        echo "[venvs] ERROR: .venvs/$n failed; the end of .build/venv-$n.log:" >&2
        tail -n 30 ".build/venv-$n.log" >&2
    fi
done
exit "$rc"
