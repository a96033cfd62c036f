"""Fixtures for the sandbox tests: real sandboxes, no mocks, under each backend.

`pool`, `sandbox` and `make_sandbox` run a test once per backend (`backend`: docker, a real dockerd and
containers; bwrap, real bubblewrap sandboxes); `only_backend("docker")` narrows a test to one. `census` sees a
backend's sandboxes from outside the code under test (dockerd's container list; the kernel's cgroup records).

Every test session uses its own server_name, so concurrent test runs never sweep or count each other's
sandboxes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest

from env_server.sandbox import PoolConfig, Sandbox, SandboxConfig, SandboxPool
from env_server.sandbox.docker.labels import selector
from env_server.sandbox.docker.socket_channel import remove_instance_dirs
from tests.harness import ContainerInfo, sandboxes_of

docker = pytest.importorskip("docker")

SERVER_NAME = f"test-{uuid.uuid4().hex[:8]}"


# TITO_TEST_RUNTIME=runsc runs every Docker sandbox test under gVisor (scripts/setup.sh with
# TITO_INSTALL_RUNSC=1 registers it); the hostile tests run under both runtimes anyway.
TEST_RUNTIME = os.environ.get("TITO_TEST_RUNTIME", "runc")


def fast_config(backend: str = "docker", **overrides: Any) -> SandboxConfig:
    """Default hardening, shorter waits so the hostile tests stay quick."""
    base: dict[str, Any] = dict(exec_timeout_s=10.0, interrupt_grace_s=0.5, kill_grace_s=1.0, backend=backend,
                                runtime=TEST_RUNTIME if backend == "docker" else "runc")
    base.update(overrides)
    return SandboxConfig(**base)


@pytest.fixture(scope="session")
def server_name() -> str:
    return SERVER_NAME


@pytest.fixture(scope="session", autouse=True)
def _remove_socket_dirs() -> None:
    """Sandboxes made outside a pool (and pools abandoned on purpose) leave their per-instance socket
    folders behind; a real server's start-up sweep would remove them, this test session does it."""
    yield
    remove_instance_dirs(SandboxConfig().socket_dir, SERVER_NAME)


@pytest.fixture(scope="session")
def docker_client(docker_ok: None) -> Any:
    client = docker.from_env(timeout=60, max_pool_size=16)
    yield client
    client.close()


class Census:
    """A backend's sandboxes seen from outside the code under test."""

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def of(self, server: str, instance: str | None = None, session: str | None = None) -> list[ContainerInfo]:
        found = sandboxes_of(self.backend, server, instance)
        return [c for c in found if session is None or c.labels.get("tito.session") == session]

    def kill_from_outside(self, sb: Sandbox) -> None:
        """As an operator or the OOM killer would: the container removed, or the sandbox's processes killed."""
        if self.backend == "docker":
            docker.from_env().api.remove_container(sb.backend_id, force=True)
        else:
            os.kill(sb.handle.process.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def census(backend: str) -> Census:
    return Census(backend)


@pytest.fixture(scope="session")
async def pool(backend: str) -> AsyncIterator[SandboxPool]:
    p = SandboxPool(fast_config(backend), PoolConfig(target_size=2, max_concurrent_creates=2, learn_demand=False),
                    server_name=SERVER_NAME, instance_id=f"main-{backend}-{uuid.uuid4().hex[:8]}")
    await p.start()
    assert p.ready, p.reason
    yield p
    await p.close()


@pytest.fixture
async def sandbox(pool: SandboxPool) -> AsyncIterator[Sandbox]:
    sb = await pool.acquire()
    yield sb
    await sb.destroy()


@pytest.fixture(scope="session")
def _executor() -> Any:
    ex = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="test-sandbox")
    yield ex
    ex.shutdown(wait=True)


@pytest.fixture
async def make_sandbox(pool: SandboxPool, _executor: Any) -> AsyncIterator[Callable[..., Awaitable[Sandbox]]]:
    """Creates a sandbox with a custom config (outside any pool, on the pool's backend); destroyed after the
    test."""
    made: list[Sandbox] = []

    async def make(**overrides: Any) -> Sandbox:
        config = fast_config(pool.sandbox_config.backend, **{"image": pool.sandbox_config.image,
                                                             "runtime": pool.sandbox_config.runtime, **overrides})
        await asyncio.get_running_loop().run_in_executor(_executor, pool.backend.probe, config.image)
        sb = await Sandbox.create(pool.backend, config, executor=_executor, timeout_s=30)
        made.append(sb)
        return sb

    yield make
    for sb in made:
        await sb.destroy()


def containers_with(client: Any, **narrowed: str) -> list[dict[str, Any]]:
    """tito's containers (any state), narrowed by server=, instance= or session= (labels.selector)."""
    return client.api.containers(all=True, filters=selector(**narrowed))
