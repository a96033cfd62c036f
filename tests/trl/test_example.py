"""examples/trl_grpo.py as a user runs it: a subprocess against the real env server, both doors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.harness import REPO

pytestmark = [pytest.mark.docker, pytest.mark.slow]


# About a minute each on an idle 2-core machine; the limits leave room for a shared, loaded one.
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("door", "steps"), [("rollout", 2), ("environment", 1)])
def test_example_trains_through_tito(server, door, steps):
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "trl_grpo.py"), "--env-address", server.address,
         "--max-steps", str(steps), "--door", door, "--steer"],
        cwd="/", env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["door"] == door and summary["steps"] == steps and len(summary["step_seconds"]) == steps
    # Steered: every rollout calls run_python once and answers right.
    assert summary["reward"] == [1.0] * steps
    assert summary["tool_calls_per_rollout"] == [1.0] * steps and summary["completed_frac"] == [1.0] * steps
