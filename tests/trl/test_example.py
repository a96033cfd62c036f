"""examples/trl_grpo.py as a user runs it: a subprocess against the real env server, both doors,
and the rollout door on TRL's vLLM (colocated, and a server started by tito.trl.vllm_server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.harness import REPO, free_port

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ENV = {"TRL_EXPERIMENTAL_SILENCE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


def run_example(server, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "trl_grpo.py"), "--env-address", server.address, *args],
        cwd="/", env={**os.environ, **ENV}, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# About a minute each on an idle 2-core machine; the limits leave room for a shared, loaded one.
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("door", "steps", "vllm"), [
    # (Two steps on vLLM, where the weights must reach the engine between them; one is enough for the doors.)
    ("rollout", 1, None), ("environment", 1, None),
    pytest.param("rollout", 2, "colocate", marks=pytest.mark.vllm)])
def test_example_trains_through_tito(server, door, steps, vllm):
    if vllm:
        pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs its CPU build)")
    summary = run_example(server, "--max-steps", str(steps), "--door", door, "--steer",
                          *(["--vllm-mode", vllm] if vllm else []))
    assert summary["door"] == door and summary["steps"] == steps and len(summary["step_seconds"]) == steps
    # Steered: every rollout calls run_python once and answers right.
    assert summary["reward"] == [1.0] * steps
    assert summary["tool_calls_per_rollout"] == [1.0] * steps and summary["completed_frac"] == [1.0] * steps


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """`python -m tito.trl.vllm_server` on a folder holding the example's model (the shape the trainer
    will push its weights into)."""
    pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs its CPU build)")
    import requests

    from tests.trl.helpers import load_example

    folder = tmp_path_factory.mktemp("vllm-server") / "model"
    load_example().write_model_dir(folder, seed=0, head_dim=32)
    port = free_port()
    log = open(folder.parent / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "tito.trl.vllm_server", "--model", str(folder), "--port", str(port),
                             "--max-model-len", "640"], cwd=REPO, env={**os.environ, **ENV}, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(1)
    else:
        proc.kill()
        raise RuntimeError(f"the vLLM server did not start: {(folder.parent / 'server.log').read_text()[-3000:]}")
    yield url, folder
    proc.terminate()
    proc.wait(30)
    log.close()


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_example_on_a_vllm_server(server, vllm_server):
    """TRL's server mode on vLLM's CPU build: no NCCL, the weights go through disk before each step's
    rollouts, so the server samples from the policy being trained (importance-sampling ratio 1)."""
    url, folder = vllm_server
    summary = run_example(server, "--max-steps", "2", "--vllm-mode", "server", "--vllm-server-url", url,
                          "--model-dir", str(folder))
    assert summary["vllm_mode"] == "server" and summary["steps"] == 2
    assert all(abs(r - 1) < 1e-3 for r in summary["importance_sampling_ratio"]), summary
