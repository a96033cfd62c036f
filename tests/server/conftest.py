from __future__ import annotations

import pytest

from tests.harness import docker_available, start_server


@pytest.fixture(scope="session")
def docker_ok() -> None:
    why = docker_available()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="module")
def server(docker_ok, tmp_path_factory):
    """A real env server subprocess (with the example guess_number environment loaded through config)."""
    tmp = tmp_path_factory.mktemp("server")
    config = tmp / "server.yaml"
    # The example custom environment is loaded through the config file, as a user would.
    config.write_text("environments: ['guess_number:GuessNumberEnvironment']\nsandbox:\n  exec_timeout_s: 5\n")
    srv = start_server(tmp, args=["--config", str(config)])
    yield srv
    srv.terminate()


@pytest.fixture
def stub(server):
    return server.stub()
