"""Fixtures for the sandbox tests: real dockerd, real containers, no mocks.

Every test session uses its own server_name, so concurrent test runs against the same daemon
never sweep or count each other's containers.
"""

from __future__ import annotations

import concurrent.futures
import os
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest

from env_server.sandbox import PoolConfig, Sandbox, SandboxConfig, SandboxPool
from env_server.sandbox.labels import selector
from env_server.sandbox.socket_channel import remove_instance_dirs

docker = pytest.importorskip("docker")

SERVER_NAME = f"test-{uuid.uuid4().hex[:8]}"


# TITO_TEST_RUNTIME=runsc runs every sandbox test under gVisor (scripts/setup.sh with
# TITO_INSTALL_RUNSC=1 registers it); the hostile tests run under both runtimes anyway.
TEST_RUNTIME = os.environ.get("TITO_TEST_RUNTIME", "runc")


def fast_config(**overrides: Any) -> SandboxConfig:
    """Default hardening, shorter waits so the hostile tests stay quick."""
    base: dict[str, Any] = dict(exec_timeout_s=10.0, interrupt_grace_s=0.5, kill_grace_s=1.0, runtime=TEST_RUNTIME)
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


@pytest.fixture(scope="session")
async def pool(docker_ok: None) -> AsyncIterator[SandboxPool]:
    p = SandboxPool(fast_config(), PoolConfig(target_size=2, max_concurrent_creates=2, learn_demand=False),
                    server_name=SERVER_NAME, instance_id=f"main-{uuid.uuid4().hex[:8]}")
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
    ex = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="test-docker")
    yield ex
    ex.shutdown(wait=True)


@pytest.fixture
async def make_sandbox(docker_client: Any, _executor: Any
                       ) -> AsyncIterator[Callable[..., Awaitable[Sandbox]]]:
    """Creates a sandbox with a custom config (outside any pool); destroyed after the test."""
    made: list[Sandbox] = []

    async def make(**overrides: Any) -> Sandbox:
        sb = await Sandbox.create(docker_client, fast_config(**overrides), server_name=SERVER_NAME,
                                  instance_id="adhoc", executor=_executor, timeout_s=30)
        made.append(sb)
        return sb

    yield make
    for sb in made:
        await sb.destroy()


def containers_with(client: Any, **narrowed: str) -> list[dict[str, Any]]:
    """tito's containers (any state), narrowed by server=, instance= or session= (labels.selector)."""
    return client.api.containers(all=True, filters=selector(**narrowed))
