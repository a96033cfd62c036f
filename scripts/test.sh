#!/usr/bin/env bash
# Runs the whole test suite: scripts/setup.sh (idempotent; fast when done), then pytest over tests/ (without
# arguments: all but the `exclusive` tests on two workers, then those in one process).
# Extra arguments go to pytest, e.g.  ./scripts/test.sh -k sandbox -x    or    ./scripts/test.sh -m "not docker"
# Env: TITO_SKIP_SETUP=1 skips setup (the .venv must exist). Setup's own switches apply (see setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# gVisor too: the hostile-code tests also run under runsc (TITO_INSTALL_RUNSC=0 leaves it out; those
# cases then skip).
export TITO_INSTALL_RUNSC=${TITO_INSTALL_RUNSC:-1}
if [ "$TITO_INSTALL_RUNSC" = 1 ]; then export TITO_REQUIRE_RUNSC=${TITO_REQUIRE_RUNSC:-1}; fi
# And bubblewrap with the images' root filesystems: the sandbox, environment and server tests run under both
# backends (TITO_INSTALL_BWRAP=0 leaves it out; the bwrap cases then skip).
export TITO_INSTALL_BWRAP=${TITO_INSTALL_BWRAP:-1}
if [ "$TITO_INSTALL_BWRAP" = 1 ]; then export TITO_REQUIRE_BWRAP=${TITO_REQUIRE_BWRAP:-1}; fi
if [ "${TITO_SKIP_SETUP:-0}" = 1 ]; then
    echo "[test] TITO_SKIP_SETUP=1: not running scripts/setup.sh"
else
    bash scripts/setup.sh
fi
[ -x .venv/bin/python ] || { echo "[test] ERROR: .venv/bin/python missing; run scripts/setup.sh" >&2; exit 1; }

if docker compose version >/dev/null 2>&1; then
    echo "[test] docker compose config -q"
    docker compose config -q
fi

export TITO_REQUIRE_DOCKER=${TITO_REQUIRE_DOCKER:-1}  # a docker test that skips fails: setup must have worked
# Likewise the real-engine vLLM tests (setup installs vLLM's CPU build); TITO_SKIP_VLLM=1 lets them skip.
if [ "${TITO_SKIP_VLLM:-0}" = 1 ]; then export TITO_REQUIRE_VLLM=${TITO_REQUIRE_VLLM:-0}; else export TITO_REQUIRE_VLLM=${TITO_REQUIRE_VLLM:-1}; fi
# And the RL frameworks' tests in their own venvs (.venvs/, built by setup); TITO_SKIP_FRAMEWORK_VENVS=1 lets them skip.
if [ "${TITO_SKIP_FRAMEWORK_VENVS:-0}" = 1 ]; then export TITO_REQUIRE_FRAMEWORKS=${TITO_REQUIRE_FRAMEWORKS:-0}; else export TITO_REQUIRE_FRAMEWORKS=${TITO_REQUIRE_FRAMEWORKS:-1}; fi
rc=0
PYTEST=(.venv/bin/python -m pytest -p no:cacheprovider --durations=25)
if [ $# -eq 0 ] && .venv/bin/python -c "import xdist" 2>/dev/null; then
    # The whole suite in two runs: first everything but the `exclusive` tests on two workers, a test file per
    # worker at a time (--dist loadfile: a file's module fixtures, such as a vLLM engine, start once); the
    # tests are independent of each other (every server has its own name, so no one sweeps or counts
    # another's sandboxes), and one worker's waits on containers and servers overlap the other's CPU work.
    # Then the `exclusive` ones in one process: the 128-open storm and the dockerd restarts need the machine.
    T0=$SECONDS
    echo "[test] ${PYTEST[*]} -n 2 --dist loadfile -m 'not exclusive' tests"
    "${PYTEST[@]}" -n 2 --dist loadfile -m "not exclusive" tests || rc=$?
    T1=$SECONDS
    # What the parallel run left, and a dockerd that answers (restarted if it hangs) for the exclusive tests.
    bash scripts/dockerd_check.sh || rc=1
    echo "[test] ${PYTEST[*]} -m exclusive tests"
    rc2=0
    "${PYTEST[@]}" -m exclusive tests || rc2=$?
    [ "$rc" != 0 ] || rc=$rc2
    echo "[test] parallel run $((T1 - T0)) s, exclusive run $((SECONDS - T1)) s"
else
    echo "[test] ${PYTEST[*]} $*"
    "${PYTEST[@]}" "$@" || rc=$?
fi
case $rc in
    0) echo "[test] all tests passed" ;;
    5) echo "[test] ERROR: pytest collected no tests (exit 5); treating that as a failure" >&2; rc=1 ;;
    *) echo "[test] pytest failed (exit $rc)" >&2 ;;
esac
exit "$rc"
