"""A nearly full disk under the backend: opens refused with a message that says so, the server up, serving again
once space returns (issue "operations", point 4). A sandbox filling its own workspace is tests/sandbox/test_hostile.py's
test_workdir_size_is_limited: the call gets "No space left on device" and the session goes on.

The watched disk is a real 16 MiB tmpfs mounted for the test (sandbox.disk_path points there; the host's own disk is
not filled), so this needs root to mount; the check itself is the server's, on a real filesystem.
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2

from tests.harness import start_server
from tests.sessions import open_session, rpc_error, run, wait_until
from tito.v1 import environment_pb2 as pb


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting the test's small tmpfs needs root")
    where = tmp_path / "disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _health(srv) -> int:
    try:
        return srv.health()
    except grpc.RpcError:
        return -1


def test_opens_wait_for_disk_space_and_the_server_recovers(isolation, small_disk, tmp_path):
    backend = isolation.backend
    srv = start_server(tmp_path, backend=backend, env={**isolation.env,
        "TITO_SANDBOX__DISK_PATH": str(small_disk), "TITO_SANDBOX__MIN_FREE_DISK_MB": "8",
        "TITO_POOL__TARGET_SIZE": "0", "TITO_POOL__PROBE_INTERVAL_S": "0.5",
    })
    stub = srv.stub()
    try:
        sid = open_session(stub)
        assert run(stub, sid, 1, "'before'").tool_messages[0].content == "Out: 'before'"

        ballast = small_disk / "ballast"
        ballast.write_bytes(b"\0" * (12 << 20))  # 4 MiB left of 16
        err = rpc_error(lambda: open_session(stub))
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err
        assert re.search(rf"the disk holding .* \(sandbox.disk_path\) \({re.escape(str(small_disk))}\) has [0-9] MiB "
                         r"free, under sandbox.min_free_disk_mb=8: no sandbox starts until space is freed",
                         err.details()), err.details()
        wait_until(lambda: _health(srv) == health_pb2.HealthCheckResponse.NOT_SERVING, 10, "health NOT_SERVING")
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5).read().decode()
        free = re.search(rf'^tito_sandbox_disk_free_bytes{{backend="{backend}",path="{re.escape(str(small_disk))}"}} (\S+)$',
                         metrics, re.M)
        assert free and float(free.group(1)) < 8 << 20, metrics[-2000:]
        # The session that was open goes on: its sandbox needs no more disk.
        assert run(stub, sid, 2, "'during'").tool_messages[0].content == "Out: 'during'"

        ballast.unlink()
        wait_until(lambda: _health(srv) == health_pb2.HealthCheckResponse.SERVING, 30, "health SERVING again")
        sid2 = open_session(stub)
        assert run(stub, sid2, 1, "'after'").tool_messages[0].content == "Out: 'after'"
        for s in (sid, sid2):
            stub.CloseSession(pb.CloseSessionRequest(session_id=s))
        assert srv.proc.poll() is None
        assert "no sandbox starts until space is freed" in srv.log()
    finally:
        srv.terminate()
