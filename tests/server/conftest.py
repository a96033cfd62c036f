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
    srv = start_server(
        tmp_path_factory.mktemp("server"),
        args=["--environment", "guess_number:GuessNumberEnvironment"],
        env={"TITO_SANDBOX__EXEC_TIMEOUT_S": "5"},
    )
    yield srv
    srv.terminate()


@pytest.fixture
def stub(server):
    return server.stub()
