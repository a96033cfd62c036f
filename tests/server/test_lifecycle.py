"""Leases, crash recovery, plug-in loading, health, reflection and metrics of a real server, under each sandbox
backend (what a server leaves behind is seen from outside it: dockerd's containers, the kernel's cgroups)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.harness import REPO, SANDBOX_IMAGE, sandboxes_of, start_server
from tests.sessions import open_session, run, wait_until
from tito.v1 import environment_pb2 as pb


@pytest.fixture(scope="module")
def server(backend_server):
    return backend_server


def test_health_and_reflection(server):
    assert server.health() == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for r in replies for s in r.list_services_response.service}
    assert "tito.v1.Environment" in names and "grpc.health.v1.Health" in names


def test_list_environments_reports_json_schemas(stub):
    envs = {e.name: e for e in stub.ListEnvironments(pb.ListEnvironmentsRequest()).environments}
    assert {"python", "guess_number"} <= set(envs)
    (run_python,) = envs["python"].tools
    schema = json.loads(run_python.parameters_json_schema)
    assert run_python.name == "run_python"
    assert schema["properties"]["code"]["type"] == "string" and schema["required"] == ["code"]
    assert "expected_answer" in json.loads(envs["python"].env_args_json_schema)["properties"]


def test_custom_environment_loaded_through_config(stub):
    sid = stub.OpenSession(
        pb.OpenSessionRequest(environment="guess_number", env_args='{"secret": 37}')
    ).session_id
    answers = []
    for seq, n in enumerate([50, 25, 37, 99], start=1):
        call = pb.ToolCall(id=str(seq), name="guess", arguments=json.dumps({"number": n}))
        r = stub.Step(pb.StepRequest(session_id=sid, seq=seq, tool_calls=[call]))
        answers.append(r.tool_messages[0].content)
        if r.done:
            break
        assert r.status == pb.STEP_STATUS_OK
    assert answers == ["lower", "higher", "correct"]
    # A tool that ends the episode: the status says so, and done is exactly status != OK.
    assert r.status == pb.STEP_STATUS_EPISODE_END and r.done and len(r.suffix_ids) == 0
    assert r.reward == pytest.approx(1 / 3)
    assert stub.CloseSession(pb.CloseSessionRequest(session_id=sid)).closed


def test_metrics_endpoint(server, stub, backend):
    sid = stub.OpenSession(pb.OpenSessionRequest(environment="python")).session_id
    call = pb.ToolCall(id="1", name="run_python", arguments='{"code": "1"}')
    stub.Step(pb.StepRequest(session_id=sid, seq=1, tool_calls=[call]))
    stub.CloseSession(pb.CloseSessionRequest(session_id=sid))
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
    for name in ("tito_sessions_active", "tito_step_latency_seconds_bucket", "tito_errors_total",
                 "tito_tool_calls_total"):
        assert name in text, name
    # Every image's pool, by image: the python session opened and closed was counted on the main image.
    image = f'image="{SANDBOX_IMAGE}"'
    for name in ("tito_pool_depth", "tito_pool_target", "tito_pool_in_use", "tito_pool_admission_waiting",
                 "tito_pool_created_total", "tito_pool_failed_total", "tito_pool_busy_total",
                 "tito_pool_cold_opens_total"):
        assert re.search(rf"^{name}{{{image}}} \d", text, re.M), name
    assert float(re.search(rf"^tito_pool_created_total{{{image}}} (\S+)$", text, re.M).group(1)) >= 1
    if backend == "bwrap":  # the memory its sandboxes' cgroups hold (this machine lets root write cgroups)
        found = re.search(rf'^tito_sandbox_memory_bytes{{backend="bwrap",{image}}} (\S+)$', text, re.M)
        assert found and float(found.group(1)) > 1 << 20, text[-2000:]
        assert "tito_sandbox_limit_fallback{" not in text  # every limit enforced: none falls back


def test_sessions_are_isolated_and_hostile_code_is_contained(stub):
    """A busy-looping session and a memory hog do not disturb 8 others running concurrently."""
    def step(sid, seq, code):
        return run(stub, sid, seq, code)

    hog, looper = open_session(stub), open_session(stub)
    workers = [open_session(stub) for _ in range(8)]
    with ThreadPoolExecutor(12) as pool:
        t0 = time.monotonic()
        loop_f = pool.submit(step, looper, 1, "while True: pass")
        hog_f = pool.submit(step, hog, 1, "x = bytearray(4 * 1024**3)")
        outs = list(pool.map(lambda iw: [step(iw[1], s, f"v = {iw[0]} * 1000 + {s}; v").tool_messages[0].content
                                         for s in range(1, 21)], enumerate(workers)))
        for i, seq_outs in enumerate(outs):
            assert seq_outs == [f"Out: {i * 1000 + s}" for s in range(1, 21)]
        loop_r = loop_f.result()
        assert "timed out" in loop_r.tool_messages[0].content
        assert time.monotonic() - t0 < 5 + 10  # the 5 s timeout plus grace
        hog_r = hog_f.result()
        assert hog_r.status == pb.STEP_STATUS_SANDBOX_LOST or "MemoryError" in hog_r.tool_messages[0].content
    # The looping session keeps its state after the interrupt.
    assert step(looper, 2, "'alive'").tool_messages[0].content == "Out: 'alive'"
    for sid in [hog, looper, *workers]:
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))


def test_idle_ttl_reclaims_abandoned_sessions(backend, tmp_path):
    srv = start_server(tmp_path, backend=backend, env={"TITO_IDLE_TTL_S": "2", "TITO_POOL__TARGET_SIZE": "1"})
    try:
        stub = srv.stub()
        sid = stub.OpenSession(pb.OpenSessionRequest(environment="python")).session_id
        assert any(c.labels.get("tito.session") == sid for c in sandboxes_of(backend, srv.server_name))
        wait_until(lambda: not any(c.labels.get("tito.session") == sid
                                   for c in sandboxes_of(backend, srv.server_name)), 10,
                   "the idle session's sandbox to go")
        with pytest.raises(grpc.RpcError) as info:
            stub.Step(pb.StepRequest(session_id=sid, seq=1))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND and "idle TTL expired" in info.value.details()
    finally:
        srv.terminate()
    assert sandboxes_of(backend, srv.server_name) == []


def test_sigkilled_client_leaves_nothing_past_idle_ttl(backend, tmp_path):
    srv = start_server(tmp_path, backend=backend, env={"TITO_IDLE_TTL_S": "3", "TITO_POOL__TARGET_SIZE": "1"})
    try:
        client = textwrap.dedent(f"""
            import grpc, sys, time
            from tito.v1 import environment_pb2 as pb, environment_pb2_grpc as pb_grpc
            stub = pb_grpc.EnvironmentStub(grpc.insecure_channel("{srv.address}"))
            sid = stub.OpenSession(pb.OpenSessionRequest(environment="python")).session_id
            call = pb.ToolCall(id="1", name="run_python", arguments='{{"code": "x = 1"}}')
            stub.Step(pb.StepRequest(session_id=sid, seq=1, tool_calls=[call]))
            print(sid, flush=True)
            time.sleep(600)
        """)
        proc = subprocess.Popen([sys.executable, "-c", client], cwd=REPO, stdout=subprocess.PIPE, text=True)
        sid = proc.stdout.readline().strip()
        assert any(c.labels.get("tito.session") == sid for c in sandboxes_of(backend, srv.server_name))
        proc.kill()
        proc.wait()
        wait_until(lambda: not any(c.labels.get("tito.session") == sid
                                   for c in sandboxes_of(backend, srv.server_name)), 3 + 5,
                   "the dead client's sandbox to go")
    finally:
        srv.terminate()


def test_sigkilled_server_is_swept_on_restart(backend, tmp_path):
    first = start_server(tmp_path, backend=backend)
    stub = first.stub()
    for _ in range(2):
        stub.OpenSession(pb.OpenSessionRequest(environment="python"))
    old = sandboxes_of(backend, first.server_name)
    assert len(old) >= 2
    old_instances = {c.labels["tito.instance"] for c in old}
    first.kill()  # SIGKILL: no cleanup runs
    second = start_server(tmp_path, backend=backend, server_name=first.server_name)
    try:
        left = [c for c in sandboxes_of(backend, first.server_name) if c.labels["tito.instance"] in old_instances]
        assert left == [], [c.name for c in left]
    finally:
        second.terminate()
    assert sandboxes_of(backend, first.server_name) == []


def test_sweep_command_removes_what_a_killed_server_left(backend, tmp_path):
    killed = start_server(tmp_path, backend=backend)
    killed.stub().OpenSession(pb.OpenSessionRequest(environment="python"))
    assert sandboxes_of(backend, killed.server_name)
    killed.kill()  # SIGKILL: no cleanup runs
    done = subprocess.run([sys.executable, "-m", "env_server", "--sweep", "--server-name", killed.server_name],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TITO_SANDBOX__BACKEND": backend})
    assert done.returncode == 0, done.stderr
    assert f"of server {killed.server_name!r}" in done.stdout
    assert sandboxes_of(backend, killed.server_name) == []


def test_graceful_shutdown_removes_everything(backend, tmp_path):
    srv = start_server(tmp_path, backend=backend)
    stub = srv.stub()
    stub.OpenSession(pb.OpenSessionRequest(environment="python"))
    assert sandboxes_of(backend, srv.server_name)
    assert srv.terminate() == 0
    assert sandboxes_of(backend, srv.server_name) == []
    assert "shut down cleanly" in srv.log()
