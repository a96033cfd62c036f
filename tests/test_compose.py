"""`docker compose up` brings the containerised server to SERVING, reachable on 127.0.0.1 only,
with reflection listing tito.v1.Environment, and sessions run through the host's Docker socket."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import docker
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.harness import REPO, containers_of, docker_available, free_port
from tito.v1 import environment_pb2 as pb
from tito.v1 import environment_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SERVER_IMAGE = "tito-env-server:latest"


def compose_available() -> str | None:
    if why := docker_available():
        return why
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0:
        return "docker compose is not installed: run scripts/setup.sh"
    try:
        docker.from_env().images.get(SERVER_IMAGE)
    except docker.errors.ImageNotFound:
        return f"{SERVER_IMAGE} is not built: run scripts/setup.sh"
    return None


@pytest.fixture(scope="module")
def compose_server():
    if why := compose_available():
        pytest.skip(why)
    project = f"tito-test-{uuid.uuid4().hex[:6]}"
    port, metrics_port = free_port(), free_port()
    env = {
        **os.environ,
        "TITO_PORT": str(port),
        "TITO_METRICS_PORT": str(metrics_port),
        "TITO_SERVER_NAME": project,
        "COMPOSE_BAKE": "false",
    }
    base = ["docker", "compose", "-p", project]
    up = subprocess.run([*base, "up", "-d", "--wait", "--wait-timeout", "120", "env-server"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    try:
        assert up.returncode == 0, f"compose up failed:\n{up.stdout}\n{up.stderr}"
        yield f"127.0.0.1:{port}", project, env
    finally:
        logs = subprocess.run([*base, "logs", "--no-color"], cwd=REPO, env=env, capture_output=True, text=True)
        down = subprocess.run([*base, "down", "--timeout", "30"], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=120)
        assert down.returncode == 0, down.stderr
        # The server's graceful shutdown removed its sandboxes.
        assert containers_of(project) == [], logs.stdout[-3000:]


def test_compose_serves_health_and_reflection(compose_server):
    address, _, _ = compose_server
    channel = grpc.insecure_channel(address)
    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    replies = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for r in replies for s in r.list_services_response.service}
    assert "tito.v1.Environment" in names
    grpcurl = shutil.which("grpcurl") or (str(REPO / ".venv/bin/grpcurl") if (REPO / ".venv/bin/grpcurl").exists() else None)
    if grpcurl:
        out = subprocess.run([grpcurl, "-plaintext", address, "list"], capture_output=True, text=True, timeout=30)
        assert "tito.v1.Environment" in out.stdout, out.stderr


def test_compose_publishes_on_loopback_only(compose_server):
    _, project, _ = compose_server
    (row,) = docker.from_env().api.containers(filters={"label": f"com.docker.compose.project={project}"})
    host_ips = {p.get("IP") for p in row["Ports"] if p.get("PublicPort")}
    assert host_ips == {"127.0.0.1"}, row["Ports"]


def test_compose_server_runs_code_in_sandboxes(compose_server):
    address, project, env = compose_server
    stub = pb_grpc.EnvironmentStub(grpc.insecure_channel(address))
    sid = stub.OpenSession(pb.OpenSessionRequest(environment="python"), timeout=60).session_id
    try:
        assert any(c.labels.get("tito.session") == sid for c in containers_of(project))
        for seq, (code, want) in enumerate([("x = 20", "(no output)"), ("x * 2 + 2", "Out: 42")], start=1):
            call = pb.ToolCall(id=str(seq), name="run_python", arguments=json.dumps({"code": code}))
            r = stub.Step(pb.StepRequest(session_id=sid, seq=seq, tool_calls=[call]), timeout=60)
            assert r.tool_messages[0].content == want
    finally:
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))
    # The fast channel works from inside the server's container (socket_dir mounted at the same path).
    logs = subprocess.run(["docker", "compose", "-p", project, "logs", "--no-color"], cwd=REPO, env=env,
                          capture_output=True, text=True).stdout
    assert "attach channel" not in logs, logs[-2000:]
