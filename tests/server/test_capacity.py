"""Admission sized from the machine (max_sessions: auto, env_server/capacity.py): opens past the limit are answered
RESOURCE_EXHAUSTED naming what set it, at once, and the server goes on (issue "operations", point 3). The
1,000-open storm against the auto limit is bench/bench_storm.py --sessions 1000 --max-sessions auto."""

from __future__ import annotations

import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from env_server.capacity import default_session_memory_mb, machine_capacity, slurm_job_memory, usable_memory
from tests.harness import start_server
from tests.sessions import open_session, rpc_error, run
from tito.v1 import environment_pb2 as pb


def test_auto_limit_refuses_what_the_memory_budget_cannot_hold(isolation, tmp_path):
    mem_mib = next(int(l.split()[1]) // 1024 for l in Path("/proc/meminfo").read_text().splitlines()
                   if l.startswith("MemTotal:"))
    # A session budgeted at all of the machine's memory: 80 % of it holds none, and the floor is one.
    srv = start_server(tmp_path, backend=isolation.backend, env={**isolation.env, "TITO_SESSION_MEMORY_MB": str(mem_mib),
                                                                "TITO_POOL__TARGET_SIZE": "1"})
    stub = srv.stub()
    try:
        assert re.search(r"max 1 sessions \(auto: 80% of [\d.]+ GiB (\([^)]*\) )?at \d+ MiB a session "
                         r"\(session_memory_mb\); "
                         r"bounds: memory 0, fds \d+, pids \d+", srv.log()), srv.log()[-2000:]
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5).read().decode()
        assert re.search(r"^tito_sessions_limit 1\.0$", metrics, re.M)

        def try_open(_: int) -> str | grpc.RpcError:
            try:
                return open_session(stub)
            except grpc.RpcError as exc:
                return exc

        with ThreadPoolExecutor(4) as ex:
            outcomes = list(ex.map(try_open, range(4)))
        opened = [o for o in outcomes if isinstance(o, str)]
        refused = [o for o in outcomes if not isinstance(o, str)]
        assert len(opened) == 1 and len(refused) == 3, outcomes
        for err in refused:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
            assert re.search(r"the server holds its maximum of 1 sessions \(auto: 80% of [\d.]+ GiB "
                             r"(\([^)]*\) )?at \d+ MiB a session \(session_memory_mb\)\); close some or retry later", err.details()), err.details()
        assert run(stub, opened[0], 1, "'held'").tool_messages[0].content == "Out: 'held'"
        stub.CloseSession(pb.CloseSessionRequest(session_id=opened[0]))
        sid = open_session(stub)  # the place is free again
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))
        err = rpc_error(lambda: [open_session(stub) for _ in range(2)])
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        srv.terminate()


def test_the_memory_budget_follows_the_isolation():
    """gVisor's sentry and gofer hold a sandbox's memory beside it: runsc sessions are budgeted at 72 MiB, runc's
    and bwrap's at 32 (a runtime tito does not know is budgeted as runc), and the start-up line says which."""
    assert [default_session_memory_mb(b, r) for b, r in [("docker", "runc"), ("docker", "runsc"),
                                                          ("bwrap", "runc"), ("docker", "kata")]] == [32, 72, 32, 32]
    runc = machine_capacity("docker", session_memory_mb=32, docker_max_containers=10**6)
    runsc = machine_capacity("docker", session_memory_mb=72, docker_max_containers=10**6)
    assert abs(runsc.bounds["memory"] * 72 - runc.bounds["memory"] * 32) < 72  # the same memory, each floored
    if runsc.bounds["memory"] == runsc.limit:
        assert "at 72 MiB a session" in runsc.why


def test_a_slurm_job_sizes_the_memory_budget_by_its_allocation(monkeypatch):
    """In a Slurm job the server budgets the job's memory (--mem, or --mem-per-cpu times its CPUs), not the
    machine's, even where no cgroup enforces it (issue 36: 602 sessions from 23.5 GiB under --mem=8G)."""
    assert slurm_job_memory({}) is None
    assert slurm_job_memory({"SLURM_MEM_PER_NODE": "0"}) is None  # --mem=0: all of the node's
    assert slurm_job_memory({"SLURM_MEM_PER_NODE": "2048"}) == (2 << 30, "SLURM_MEM_PER_NODE")
    assert slurm_job_memory({"SLURM_MEM_PER_CPU": "512", "SLURM_CPUS_ON_NODE": "4"}) == (
        2 << 30, "SLURM_MEM_PER_CPU x SLURM_CPUS_ON_NODE")
    for var in ("SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU", "SLURM_CPUS_ON_NODE"):
        monkeypatch.delenv(var, raising=False)
    machine, _ = usable_memory()
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "2048")
    assert usable_memory() == (2 << 30, "the Slurm job's memory, SLURM_MEM_PER_NODE")  # less than any test machine
    cap = machine_capacity("bwrap", session_memory_mb=32, docker_max_containers=400)
    assert cap.bounds["memory"] == 51
    assert cap.why == ("auto: 80% of 2.0 GiB (the Slurm job's memory, SLURM_MEM_PER_NODE) at 32 MiB a session "
                       "(session_memory_mb)"), cap.why
    monkeypatch.setenv("SLURM_MEM_PER_NODE", str(10 ** 9))  # more than the machine: the machine binds
    assert usable_memory()[0] == machine
