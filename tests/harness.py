"""Starts real env servers as subprocesses on loopback, for tests and benchmarks."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import docker
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from env_server.sandbox.config import DEFAULT_IMAGE
from env_server.sandbox.docker.labels import selector
from tito.v1 import environment_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parent.parent
SANDBOX_IMAGE = DEFAULT_IMAGE  # TITO_SANDBOX_IMAGE moves it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def docker_available() -> str | None:
    """None when Docker and the sandbox image are usable, else why not."""
    try:
        client = docker.from_env(timeout=10)
        client.ping()
        client.images.get(SANDBOX_IMAGE)
    except docker.errors.ImageNotFound:
        return f"sandbox image {SANDBOX_IMAGE} missing: run scripts/setup.sh"
    except Exception as e:
        return f"Docker daemon unavailable: {e}"
    return None


# The sandbox backends a test runs under, as parameters of the `backend` fixture (tests/conftest.py). Each
# carries its marker, so that a skip fails under its TITO_REQUIRE_*.
BACKENDS = [pytest.param("docker", marks=pytest.mark.docker, id="docker"),
            pytest.param("bwrap", marks=pytest.mark.bwrap, id="bwrap")]


# The isolations a fault test runs under, as parameters of the `isolation` fixture (tests/conftest.py): Docker
# with runc, Docker with gVisor's runsc, and bubblewrap. runsc's carries the `runsc` marker (a skip fails under
# TITO_REQUIRE_RUNSC=1, which scripts/test.sh sets).
ISOLATIONS = [pytest.param(("docker", "runc"), marks=pytest.mark.docker, id="runc"),
              pytest.param(("docker", "runsc"), marks=[pytest.mark.docker, pytest.mark.runsc], id="runsc"),
              pytest.param(("bwrap", None), marks=pytest.mark.bwrap, id="bwrap")]


def runsc_missing() -> str | None:
    """None when dockerd has gVisor's runtime registered, else why not."""
    try:
        client = docker.from_env(timeout=10)
        try:
            if "runsc" in (client.info().get("Runtimes") or {}):
                return None
        finally:
            client.close()
    except docker.errors.DockerException as exc:
        return f"Docker daemon unavailable: {exc}"
    return "dockerd has no runsc runtime (TITO_INSTALL_RUNSC=1 scripts/setup.sh registers it)"


def only_backend(*names: str) -> pytest.MarkDecorator:
    """Runs a test that uses the `backend` fixture under these backends only."""
    return pytest.mark.parametrize("backend", [p for p in BACKENDS if p.values[0] in names], indirect=True)


def bwrap_available(image: str = SANDBOX_IMAGE) -> str | None:
    """None when bubblewrap and the image's root filesystem are usable, else why not."""
    from env_server.sandbox.bwrap import rootfs

    if shutil.which("bwrap") is None:
        return "bwrap not installed: run TITO_SANDBOX_BACKEND=bwrap scripts/setup.sh (or apt-get install bubblewrap)"
    try:
        rootfs.load(rootfs.default_rootfs_dir(), image)
    except Exception as e:  # noqa: BLE001 - BackendUnavailable says what to build
        return str(e)
    return None


@dataclass(frozen=True)
class ContainerInfo:
    """One sandbox as seen from outside the server: a container, or a bwrap sandbox's cgroup with processes."""

    id: str
    name: str
    labels: dict[str, str]


def containers_of(server_name: str, instance: str | None = None) -> list[ContainerInfo]:
    """Containers (any state) of a server. One list call: no per-container inspect that could race
    with a server removing them."""
    rows = docker.from_env().api.containers(all=True, filters=selector(server=server_name, instance=instance))
    return [ContainerInfo(r["Id"], r["Names"][0].lstrip("/"), r.get("Labels") or {}) for r in rows]


def bwrap_sandboxes_of(server_name: str, instance: str | None = None, *, running_only: bool = False
                       ) -> list[ContainerInfo]:
    """bwrap sandboxes of a server, seen from the kernel rather than the server: their cgroup folders
    (.../tito-<server>/<instance>/<sandbox>, in any state, like Docker's list of containers), or with
    `running_only` those that hold a live process (from /proc/<pid>/cgroup)."""
    found: dict[str, str] = {}
    if running_only:
        pattern = re.compile(rf"/tito-{re.escape(server_name)}/([^/\n]+)/([^/\n]+)$", re.M)
        for proc in Path("/proc").iterdir():
            try:
                text = (proc / "cgroup").read_text() if proc.name.isdigit() else ""
            except OSError:
                continue
            found.update({session: inst for inst, session in pattern.findall(text)})
    else:
        folder = f"tito-{server_name}"
        for root, dirs, _ in os.walk("/sys/fs/cgroup"):
            if folder in dirs:
                dirs.remove(folder)
                for inst in (Path(root) / folder).iterdir():
                    found.update({p.name: inst.name for p in inst.iterdir() if p.is_dir()} if inst.is_dir() else {})
    return [ContainerInfo(session, session,
                          {"tito.server": server_name, "tito.instance": inst, "tito.session": session})
            for session, inst in sorted(found.items()) if instance is None or inst == instance]


def sandboxes_of(backend: str, server_name: str, instance: str | None = None) -> list[ContainerInfo]:
    """What a server (`backend` docker or bwrap) has running or left, seen from outside it."""
    return bwrap_sandboxes_of(server_name, instance) if backend == "bwrap" else containers_of(server_name, instance)


@dataclass
class ServerProcess:
    port: int
    server_name: str
    proc: subprocess.Popen
    metrics_port: int
    log_path: Path
    # TLS servers: how the harness's own channel (health checks, stub()) connects.
    credentials: grpc.ChannelCredentials | None = None
    channel_options: list[tuple[str, str]] = field(default_factory=list)
    channel: grpc.Channel = field(init=False)

    def __post_init__(self) -> None:
        self.channel = (grpc.secure_channel(self.address, self.credentials, options=self.channel_options)
                        if self.credentials else grpc.insecure_channel(self.address))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stub(self) -> pb_grpc.EnvironmentStub:
        return pb_grpc.EnvironmentStub(self.channel)

    def health(self) -> int:
        stub = health_pb2_grpc.HealthStub(self.channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_serving(self, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"env server exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                if self.health() == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"env server not SERVING after {timeout_s}s:\n{self.log()[-4000:]}")

    def terminate(self, timeout_s: float = 30) -> int:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def kill(self) -> None:
        self.channel.close()
        self.proc.kill()
        self.proc.wait()


def start_server(
    tmp_dir: Path,
    server_name: str | None = None,
    env: dict[str, str] | None = None,
    args: list[str] | None = None,
    wait: bool = True,
    credentials: grpc.ChannelCredentials | None = None,
    channel_options: list[tuple[str, str]] | None = None,
    port: int | None = None,
    backend: str = "docker",
    user: int | None = None,
) -> ServerProcess:
    """`port`: listen there (a restarted replica on its old address), else on a free port. `backend`: where its
    sandboxes run (sandbox.backend). `user`: run the server as this uid (and gid), no supplementary groups.
    A free port is found by binding and closing a socket, so another process (the other pytest worker's server)
    can take it before this server binds it: then the server is started again on other free ports, twice at most."""
    for attempt in range(3):
        server = _start_server(tmp_dir, server_name, env, args, credentials, channel_options, port, backend, user)
        if not wait:
            return server
        try:
            server.wait_serving()
            return server
        except RuntimeError:
            server.channel.close()
            if port is not None or attempt == 2 or "Address already in use" not in server.log():
                raise
    raise AssertionError("unreachable")


def _start_server(tmp_dir: Path, server_name: str | None, env: dict[str, str] | None, args: list[str] | None,
                  credentials: grpc.ChannelCredentials | None, channel_options: list[tuple[str, str]] | None,
                  port: int | None, backend: str, user: int | None) -> ServerProcess:
    port, metrics_port = port or free_port(), free_port()
    server_name = server_name or f"test-{uuid.uuid4().hex[:8]}"
    log_path = tmp_dir / f"server-{server_name}-{port}.log"
    full_env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "examples" / "custom_env")]),
        "TITO_POOL__TARGET_SIZE": "2",
        # A fixed warm pool, so tests can count containers; tests/sandbox/test_demand.py and the storm test
        # cover the learning pool.
        "TITO_POOL__LEARN_DEMAND": "false",
        # No warm pool for the other images (python_scientific starts its sandboxes on demand): the warm
        # containers a test counts are the 2 above.
        "TITO_POOL__OTHER_IMAGES_TARGET_SIZE": "0",
        "TITO_SANDBOX__BACKEND": backend,
        **(env or {}),
    }
    cmd = [
        sys.executable, "-m", "env_server",
        "--port", str(port), "--metrics-port", str(metrics_port), "--server-name", server_name,
        *(args or []),
    ]
    with open(log_path, "wb") as log_file:
        as_user = {} if user is None else {"user": user, "group": user, "extra_groups": []}
        proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=log_file, stderr=subprocess.STDOUT, **as_user)
    return ServerProcess(port, server_name, proc, metrics_port, log_path, credentials, channel_options or [])
