#!/usr/bin/env bash
# Builds the RL frameworks' own virtual environments (.venvs/NAME), one per scripts/venvs/NAME.sh, all at once:
# the integration tests (tests/integrations) run verl's, AReaL's and OpenEnv's own code there, beside a tito
# client installed with `pip install .` (gRPC only), never in the project's .venv.
# Each NAME.sh is idempotent (a stamp in its venv says what it was built from) and logs to .build/venv-NAME.log.
# The venvs are cached outside the checkout, one folder per (script, the client's dependencies in pyproject.toml,
# interpreter):
# .venvs/NAME is a link to $TITO_VENV_CACHE/NAME-<key>, so a fresh clone (CI) reuses what an earlier one built
# instead of installing 2 GB of frameworks again; older keys of the same name are removed once a new one is built.
# Tests put the checkout first on PYTHONPATH, so the copy of tito installed in a cached venv is never what runs.
#   bash scripts/framework_venvs.sh            # all of them
#   bash scripts/framework_venvs.sh verl       # one
# Env: TITO_PYTHON (interpreter for the venvs, default python3.11 or python3);
#      TITO_VENV_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/tito/venvs).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .build .venvs
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for f in scripts/venvs/*.sh; do [ -e "$f" ] && names+=("$(basename "$f" .sh)"); done
fi
[ ${#names[@]} -gt 0 ] || { echo "[venvs] no scripts/venvs/*.sh"; exit 0; }
CACHE=${TITO_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tito/venvs}
mkdir -p "$CACHE"
py=${TITO_PYTHON:-$(command -v python3.11 || command -v python3)}
pyv=$("$py" -c 'import sys; print(sys.version)')
# What a venv holds of this checkout is the client's dependencies (`pip install .`): extras do not count.
deps=$("$py" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"])')
declare -A pids starts dirs
for n in "${names[@]}"; do
    [ -f "scripts/venvs/$n.sh" ] || { echo "[venvs] ERROR: no scripts/venvs/$n.sh" >&2; exit 2; }
    key=$( { cat "scripts/venvs/$n.sh"; echo "$deps"; echo "$pyv"; } | sha256sum | cut -c1-16)
    dirs[$n]=$CACHE/$n-$key
    starts[$n]=$SECONDS
    TITO_VENV_DIR=${dirs[$n]} TITO_PYTHON=$py bash "scripts/venvs/$n.sh" >".build/venv-$n.log" 2>&1 &
    pids[$n]=$!
done
rc=0
for n in "${names[@]}"; do
    if wait "${pids[$n]}"; then
        rm -rf ".venvs/$n"  # a link to an older key, or a venv built in place before the cache
        ln -s "${dirs[$n]}" ".venvs/$n"
        for old in "$CACHE/$n"-*; do [ "$old" = "${dirs[$n]}" ] || rm -rf "$old"; done
        echo "[venvs] .venvs/$n ready ($((SECONDS - ${starts[$n]})) s; ${dirs[$n]}; log .build/venv-$n.log)"
    else
        rc=1
        echo "[venvs] ERROR: .venvs/$n failed; the end of .build/venv-$n.log:" >&2
        tail -n 30 ".build/venv-$n.log" >&2
    fi
done
exit "$rc"
