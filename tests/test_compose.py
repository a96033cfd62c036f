"""`docker compose up` brings the containerised server to SERVING, reachable on 127.0.0.1 only,
with reflection listing tito.v1.Environment, and sessions run through the host's Docker socket.
With compose.tls.yaml it serves TLS and wants a token; the replicas profile gives distinct names.

The image is `tito-env-server:latest`, or $TITO_SERVER_IMAGE (as compose.yaml itself reads it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from contextlib import contextmanager

import docker
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.harness import REPO, containers_of, docker_available, free_port
from tito.v1 import environment_pb2 as pb
from tito.v1 import environment_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SERVER_IMAGE = os.environ.get("TITO_SERVER_IMAGE", "tito-env-server:latest")


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


@contextmanager
def compose_up(files: list[str], extra_env: dict[str, str] | None = None):
    """`docker compose up --wait env-server` in a project of its own; yields (address, project, env, base)."""
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
        **(extra_env or {}),
    }
    base = ["docker", "compose", "-p", project, *(a for f in files for a in ("-f", f))]
    up = subprocess.run([*base, "up", "-d", "--wait", "--wait-timeout", "120", "env-server"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    try:
        logs = lambda: subprocess.run([*base, "logs", "--no-color"], cwd=REPO, env=env,  # noqa: E731
                                      capture_output=True, text=True).stdout
        assert up.returncode == 0, f"compose up failed:\n{up.stdout}\n{up.stderr}\n{logs()[-3000:]}"
        yield f"127.0.0.1:{port}", project, env, base
    finally:
        final_logs = logs()
        down = subprocess.run([*base, "down", "--timeout", "30"], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=120)
        assert down.returncode == 0, down.stderr
        # The server's graceful shutdown removed its sandboxes.
        assert containers_of(project) == [], final_logs[-3000:]


@pytest.fixture(scope="module")
def compose_server():
    with compose_up(["compose.yaml"]) as (address, project, env, _):
        yield address, project, env


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


def compose_config(*args: str) -> dict:
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("docker compose is not installed: run scripts/setup.sh")
    out = subprocess.run(["docker", "compose", *args, "config", "--format", "json"], cwd=REPO,
                         env={**os.environ, "TITO_SERVER_NAME": "compose"}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["services"]


def test_compose_files_say_how_they_are_secured_and_replicated():
    plain = compose_config()
    # 0.0.0.0 inside the container is allowed explicitly, because the host publishes loopback only.
    assert plain["env-server"]["environment"]["TITO_ALLOW_INSECURE"] == "1"
    assert set(plain) == {"env-server"}  # replicas and the build service are behind profiles
    replicas = compose_config("--profile", "replicas")
    names = {s["environment"]["TITO_SERVER_NAME"] for n, s in replicas.items() if n.startswith("env-server")}
    ports = {p["published"] for n, s in replicas.items() if n.startswith("env-server") for p in s["ports"]}
    assert names == {"compose", "compose-2", "compose-3"} and len(ports) == 6
    secured = compose_config("-f", "compose.yaml", "-f", "compose.tls.yaml", "--profile", "replicas")
    for name in ("env-server", "env-server-2", "env-server-3"):
        env = secured[name]["environment"]
        assert env["TITO_ALLOW_INSECURE"] == "0" and env["TITO_TLS__CERT_FILE"] and env["TITO_AUTH__TOKENS_FILE"]
        assert {p["host_ip"] for p in secured[name]["ports"]} == {"127.0.0.1"}  # unless TITO_PUBLISH_HOST


def image_has_auth() -> bool:
    probe = subprocess.run(["docker", "run", "--rm", "--entrypoint", "python", SERVER_IMAGE, "-c",
                            "import env_server.auth"], capture_output=True, timeout=120)
    return probe.returncode == 0


def test_compose_tls_override_serves_tls_and_wants_a_token(tmp_path):
    from tests.deploy.certs import CertAuthority
    from tito.client import TitoClient, TlsOptions, UnauthenticatedError

    if compose_available() is None and not image_has_auth():
        pytest.skip(f"{SERVER_IMAGE} predates TLS support: rebuild it (scripts/build_images.sh)")
    ca = CertAuthority(tmp_path, "ca")
    server = ca.issue("server", server=True)
    assert {ca.cert.name, server.cert.name, server.key.name} == {"ca.pem", "server.pem", "server.key"}
    (tmp_path / "tokens").write_text("compose-test-token-0123456789\n")
    # --wait passes only once the container's own health check, over TLS, says SERVING.
    with compose_up(["compose.yaml", "compose.tls.yaml"], {"TITO_TLS_DIR": str(tmp_path)}) as (address, *_):
        tls = TlsOptions(ca_file=tmp_path / "ca.pem")
        with TitoClient(address, tls=tls, token="compose-test-token-0123456789") as client:
            assert "python" in {e.name for e in client.list_environments()}
        with TitoClient(address, tls=tls) as client, pytest.raises(UnauthenticatedError):
            client.list_environments()
