"""Suite-wide rules.

In CI (CI=true) or with TITO_REQUIRE_DOCKER=1, a Docker test that skips (daemon down, image or
compose missing) FAILS instead: a half-finished setup must not turn the real-container tests into a
green run that tested nothing. GPU tests still skip without CUDA.
"""

from __future__ import annotations

import os

import pytest

REQUIRE_DOCKER = os.environ.get("TITO_REQUIRE_DOCKER", "1" if os.environ.get("CI") == "true" else "0") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_DOCKER and report.skipped and item.get_closest_marker("docker") and not item.get_closest_marker("gpu"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"Docker test skipped but TITO_REQUIRE_DOCKER/CI requires it to run: {reason}"
