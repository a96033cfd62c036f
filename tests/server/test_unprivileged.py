"""The cluster case: a server run by an unprivileged user, sandboxes on the bwrap backend, no Docker involved.

As root, the test runs the server as `nobody` (uid 65534). Such a user may not write cgroups here, so the server
must say which limits fall back to rlimits (its log, the pool's health detail, /metrics) and still hold them:
memory by RLIMIT_AS (a MemoryError, not an OOM kill), processes by RLIMIT_NPROC. The conformance suite passes
against it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from env_server.sandbox.bwrap import rootfs
from env_server.sandbox.bwrap.command import SH_INIT
from tests.harness import REPO, start_server
from tito.client import StepStatus, TitoClient
from tito.types import ToolCall

pytestmark = pytest.mark.bwrap
NOBODY = 65534


def _grant_traverse(path: Path) -> list[tuple[Path, int]]:
    """Lets others walk down to `path` (o+x on each folder above it that lacks it): the checkout may sit below a
    private home. Returns what it changed, to put back."""
    changed = []
    for folder in [*reversed(path.parents), path]:
        mode = folder.stat().st_mode
        if not mode & 0o001:
            os.chmod(folder, mode | 0o001)
            changed.append((folder, mode))
    return changed


@pytest.fixture(scope="module")
def unprivileged_server(bwrap_ok, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("unprivileged")
    user = NOBODY if os.geteuid() == 0 else None  # an unprivileged test run is the case itself
    # The interpreter too: a virtual environment's python is a link to one that may sit in a private home.
    interpreter = Path(os.path.realpath(sys.executable)).parent
    changed = _grant_traverse(interpreter) + _grant_traverse(REPO) if user is not None else []
    env = {"TITO_SANDBOX__BWRAP__ROOTFS_DIR": str(rootfs.default_rootfs_dir()), "HOME": "/nonexistent",
           "TITO_SANDBOX__EXEC_TIMEOUT_S": "10", "TITO_SANDBOX__MEM_LIMIT": "256m"}
    try:
        srv = start_server(tmp_path, backend="bwrap", user=user, env=env)
    except BaseException:
        for folder, mode in changed:
            os.chmod(folder, mode)
        raise
    yield srv
    srv.terminate()
    for folder, mode in changed:
        os.chmod(folder, mode)


def _run(session, code: str) -> str:
    r = session.step(tool_calls=[ToolCall("c", "run_python", json.dumps({"code": code}))])
    assert r.status is StepStatus.OK, r
    return r.tool_messages[0].content


def test_an_unprivileged_server_runs_sandboxes_and_says_which_limits_fall_back(unprivileged_server):
    srv = unprivileged_server
    uid = int(Path(f"/proc/{srv.proc.pid}/status").read_text().split("Uid:")[1].split()[0])
    assert uid != 0
    with TitoClient(srv.address) as client:
        with client.open_session("python") as s:
            assert _run(s, "import os\nos.getuid(), os.getcwd()") == "Out: (1000, '/workspace')"
            # Memory: RLIMIT_AS stands in for the cgroup: the allocation fails inside, the session goes on.
            assert "MemoryError" in _run(s, "x = bytearray(400 * 1024 * 1024)")
            # Processes: RLIMIT_NPROC (64) stops a fork bomb; the REPL still answers.
            out = _run(s, "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
                          "            time.sleep(30)\n            os._exit(0)\n        n += 1\n"
                          "except OSError as e:\n    print('fork failed after', n)\nn < 64")
            assert "fork failed after" in out and out.endswith("Out: True"), out
            assert _run(s, "21 * 2") == "Out: 42"
    if os.geteuid() == 0:  # as nobody, no cgroup can be written here: the fallback is said everywhere
        log = srv.log()
        assert re.search(r"no cgroup for memory \(falls back to RLIMIT_AS per process\), pids \(falls back to "
                         r"RLIMIT_NPROC\), cpu \(falls back to nothing \(no CPU quota\)\)", log), log[-3000:]
        assert "health: SERVING (ready:" in log and "(bwrap backend; no cgroup for memory" in log
        text = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5).read().decode()
        for limit in ("memory", "pids", "cpu"):
            assert re.search(rf'^tito_sandbox_limit_fallback{{backend="bwrap",image="[^"]+",limit="{limit}"}} 1\.0$',
                             text, re.M), limit



def test_an_unprivileged_server_says_memory_is_unbounded_and_quotas_shared_and_keeps_its_walls(unprivileged_server):
    """Issue 34: where no cgroup holds memory, RLIMIT_AS does not count memfd pages, and all sandboxes run as the
    server's uid (its per-user kernel quotas shared): said plainly at start, in the health detail and /metrics.
    The walls that need no privilege hold here too: pid 1 holds no handle back to the server, /proc/sys and /dev
    are read-only."""
    srv = unprivileged_server
    log = srv.log()
    shared = "sessions share one host uid's per-user kernel quotas (inotify instances and watches, POSIX message"
    assert re.search(r"WARNING .*bwrap sandboxes: .*" + re.escape(shared), log), log[-3000:]
    health = [line for line in log.splitlines() if "health: SERVING (ready:" in line]
    assert health and shared in health[-1], log[-3000:]
    flags = ["per_user_quotas_shared"]
    if os.geteuid() == 0:  # as nobody no cgroup can be written here: memory has no bound but RLIMIT_AS
        unbounded = "memory is NOT bounded: RLIMIT_AS does not count memfd or shared memory pages"
        assert re.search(r"WARNING .*bwrap sandboxes: .*" + re.escape(unbounded), log), log[-3000:]
        assert unbounded in health[-1]
        flags.append("memory_unbounded")
    text = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5).read().decode()
    for flag in flags:
        assert re.search(rf'^tito_sandbox_limit_fallback{{backend="bwrap",image="[^"]+",limit="{flag}"}} 1\.0$',
                         text, re.M), flag
    with TitoClient(srv.address) as client:
        with client.open_session("python") as s:
            out = _run(s, "import os\nfds = [os.readlink('/proc/1/fd/' + f) for f in os.listdir('/proc/1/fd')]\n"
                          "def write(p):\n    try:\n        open(p, 'w').write('1')\n        return 'written'\n"
                          "    except OSError as e:\n        return e.strerror\n"
                          "(sorted(set(fds)), len(fds), open('/proc/1/cmdline').read().split(chr(0))[:3], "
                          "write('/proc/sys/kernel/msgmax'), write('/dev/planted'))")
            # pid 1: the shell init (bwrap/command.py), holding /dev/null only.
            assert out == ("Out: (['/dev/null'], 3, " + repr(["/bin/sh", "-c", SH_INIT]) + ", "
                           "'Read-only file system', 'Read-only file system')"), out


def test_conformance_passes_against_an_unprivileged_bwrap_server(unprivileged_server):
    proc = subprocess.run([sys.executable, "-m", "tito.conformance", "--address", unprivileged_server.address],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "conformance: passed 13 of 13"
