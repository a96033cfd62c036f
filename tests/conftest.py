"""Suite-wide rules.

In CI (CI=true) or with TITO_REQUIRE_DOCKER=1, a Docker test that skips (daemon down, image or
compose missing) FAILS instead: a half-finished setup must not turn the real-container tests into a
green run that tested nothing. The same holds for the bubblewrap tests (marker `bwrap`) under
TITO_REQUIRE_BWRAP=1 and the real-engine vLLM tests (marker `vllm`) under TITO_REQUIRE_VLLM=1, which
scripts/test.sh sets. GPU tests still skip without CUDA.
"""

from __future__ import annotations

import os

import pytest

from dataclasses import dataclass

from tests.harness import BACKENDS, ISOLATIONS, bwrap_available, docker_available, runsc_missing, start_server

REQUIRE_DOCKER = os.environ.get("TITO_REQUIRE_DOCKER", "1" if os.environ.get("CI") == "true" else "0") == "1"
REQUIRE_BWRAP = os.environ.get("TITO_REQUIRE_BWRAP", "1" if os.environ.get("CI") == "true" else "0") == "1"
REQUIRE_VLLM = os.environ.get("TITO_REQUIRE_VLLM", "0") == "1"
REQUIRE_RUNSC = os.environ.get("TITO_REQUIRE_RUNSC", "0") == "1"
REQUIRE_FRAMEWORKS = os.environ.get("TITO_REQUIRE_FRAMEWORKS", "0") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or item.get_closest_marker("gpu"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if REQUIRE_RUNSC and item.get_closest_marker("runsc"):
        report.outcome = "failed"
        report.longrepr = f"gVisor test skipped but TITO_REQUIRE_RUNSC requires it to run: {reason}"
    elif REQUIRE_DOCKER and item.get_closest_marker("docker"):
        report.outcome = "failed"
        report.longrepr = f"Docker test skipped but TITO_REQUIRE_DOCKER/CI requires it to run: {reason}"
    elif REQUIRE_BWRAP and item.get_closest_marker("bwrap"):
        report.outcome = "failed"
        report.longrepr = f"bwrap test skipped but TITO_REQUIRE_BWRAP/CI requires it to run: {reason}"
    elif REQUIRE_FRAMEWORKS and item.get_closest_marker("framework"):
        report.outcome = "failed"
        report.longrepr = (f"framework test skipped but TITO_REQUIRE_FRAMEWORKS requires it to run "
                           f"(scripts/setup.sh builds .venvs/ with scripts/framework_venvs.sh): {reason}")
    elif REQUIRE_VLLM and item.get_closest_marker("vllm"):
        report.outcome = "failed"
        report.longrepr = f"vLLM test skipped but TITO_REQUIRE_VLLM requires it to run (scripts/setup.sh installs vLLM): {reason}"


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture parameters
def pytest_collection_modifyitems(config, items):
    """Tests that need the machine to themselves run last, and those that restart dockerd after every other:
    every other test's servers and containers are gone by then."""
    items.sort(key=lambda item: (item.get_closest_marker("exclusive") is not None,
                                 item.get_closest_marker("daemon_restart") is not None))


@pytest.fixture(scope="session")
def docker_ok() -> None:
    why = docker_available()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="session")
def bwrap_ok() -> None:
    why = bwrap_available()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request) -> str:
    """The sandbox backend a test runs under (tests.harness.BACKENDS; `only_backend` narrows it)."""
    request.getfixturevalue("docker_ok" if request.param == "docker" else "bwrap_ok")
    return request.param


@dataclass(frozen=True)
class Isolation:
    """How a fault test's server isolates its sandboxes: a backend, and Docker's OCI runtime."""

    backend: str
    runtime: str | None

    @property
    def env(self) -> dict[str, str]:
        """The server's environment for it (with `backend=` to tests.harness.start_server)."""
        return {"TITO_SANDBOX__RUNTIME": self.runtime} if self.runtime else {}


@pytest.fixture(params=ISOLATIONS)
def isolation(request) -> Isolation:
    """runc, runsc or bwrap (tests.harness.ISOLATIONS): the fault tests run under each."""
    backend, runtime = request.param
    request.getfixturevalue("docker_ok" if backend == "docker" else "bwrap_ok")
    if runtime == "runsc" and (why := runsc_missing()):
        pytest.skip(why)
    return Isolation(backend, runtime)


def _example_server(tmp, backend: str):
    config = tmp / "server.yaml"
    config.write_text("environments: ['guess_number:GuessNumberEnvironment']\nsandbox:\n  exec_timeout_s: 5\n")
    return start_server(tmp, args=["--config", str(config)], backend=backend)


@pytest.fixture(scope="module")
def server(docker_ok, tmp_path_factory):
    """A real env server subprocess (one per test module), with the example guess_number environment
    loaded through a config file, as a user would."""
    srv = _example_server(tmp_path_factory.mktemp("server"), "docker")
    yield srv
    srv.terminate()


@pytest.fixture(scope="module")
def backend_server(backend, tmp_path_factory):
    """The same, once per sandbox backend: a module whose tests differ by backend makes it its `server`."""
    srv = _example_server(tmp_path_factory.mktemp(f"server-{backend}"), backend)
    yield srv
    srv.terminate()


@pytest.fixture
def stub(server):
    return server.stub()
