# Sourced by the image and root filesystem builders: BUILD_PYTHON, the interpreter that runs
# env_server.sandbox.bwrap.rootfs_build from this checkout. The builder needs only the standard library, so
# a bare python3 >= 3.11 will do before .venv exists (setup bootstraps the base beside `pip install`).
if [ -n "${TITO_BUILD_PYTHON:-}" ]; then
    BUILD_PYTHON=$TITO_BUILD_PYTHON
elif [ -x .venv/bin/python ]; then
    BUILD_PYTHON=.venv/bin/python
else
    BUILD_PYTHON=python3
fi
"$BUILD_PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
    || { printf 'ERROR: %s is not a Python >= 3.11 (set TITO_BUILD_PYTHON, or run scripts/setup.sh)\n' "$BUILD_PYTHON" >&2; exit 1; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
