"""Data parallel on CPU: two real processes (torchrun / accelerate launch, gloo).

Each rank generates its share of the prompt groups, the gradients are summed across ranks, rank 0
writes the outputs. The ranks' weights must stay identical and their rollouts must differ; and
because sampling seeds follow a rollout's place in the global batch, two ranks take the same
steps as one process does with the whole batch (up to float summation order).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.config import load_config
from trainer.setup import open_run
from trainer.train import train

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
# The no-env task on a small vocabulary: fast, and every rollout is one sampled turn.
TOKENS = ["task.name=token_subset", "task.params={fraction: 0.5, prompt_len: 8}", "model.vocab_size=2048",
          "model.device=cpu", "budget.context=40", "budget.per_turn=16", "budget.reserve=0", "budget.max_turns=1",
          "num_generations=4", "prompts_per_step=2", "steps=2", "learning_rate=0.03", "progress=false", "seed=1"]


def sets(items: list[str]) -> list[str]:
    return [a for item in items for a in ("--set", item)]


def launch(cmd: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_adam_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Weights trained on the same batch, summed in another order (ranks, shards): Adam divides by the root of
    the squared gradient, so a component near zero (a rarely seen embedding row) moves by up to lr whatever its
    float error. A bound on the largest difference and on the share of weights beyond 1e-5."""
    diffs = torch.cat([(got[k] - want[k]).abs().flatten() for k in got])
    assert diffs.max() < 1e-3 and (diffs > 1e-5).float().mean() < 5e-3, (diffs.max(), (diffs > 1e-5).sum())


def assert_ranks_identical(out: Path) -> dict[str, torch.Tensor]:
    w0, w1 = torch.load(out / "rank0.pt"), torch.load(out / "rank1.pt")
    assert w0.keys() == w1.keys()
    for k in w0:
        assert torch.equal(w0[k], w1[k]), k
    return w0


def test_two_ranks_stay_identical_and_match_one_process(tmp_path):
    out = tmp_path / "ddp"
    launch([*TORCHRUN, "-m", "tests.trainer.dist_run", str(out), *sets([*TOKENS, "save_steps=1",
                                                                         "save_total_limit=2"])])
    weights = assert_ranks_identical(out)
    metrics = rows(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["rollouts"] == 8 and m["ranks"] == 2 for m in metrics)  # both ranks' rollouts
    rollouts = rows(out / "rollouts.jsonl")
    for step in (1, 2):
        by_rank = [{r["ids_sha1"] for r in rollouts if r["step"] == step and r["rank"] == k} for k in (0, 1)]
        assert len(by_rank[0]) == len(by_rank[1]) == 4 and not by_rank[0] & by_rank[1]
    ckpt = out / "checkpoints" / "step-000001"
    assert sorted(p.name for p in (ckpt / "rng").iterdir()) == ["rank0.pt", "rank1.pt"]

    # One process with the whole batch: the same rollouts, the same step.
    cfg = load_config(None, [*TOKENS, "save_checkpoint=false"], {"output_dir": str(tmp_path / "one")})

    async def one():
        async with open_run(cfg) as run:
            history = await train(run, cfg)
            return history, {k: v.detach().clone() for k, v in run.model.state_dict().items()}

    history, single = asyncio.run(one())
    single_rollouts = rows(tmp_path / "one" / "rollouts.jsonl")
    assert sorted((r["step"], r["ids_sha1"]) for r in single_rollouts) == \
        sorted((r["step"], r["ids_sha1"]) for r in rollouts)
    for a, b in zip(history, metrics):
        assert a["reward_mean"] == b["reward_mean"]
        # A norm over ~10M float32 components summed in another order: ~1e-5 apart (1.1e-5 seen).
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    assert single.keys() == weights.keys()
    assert_adam_close(weights, single)


def test_accelerate_launch_runs_the_cli(tmp_path):
    # accelerate's multi-process launcher is --multi_gpu (torchrun underneath; its --cpu runs one
    # process unless MPI is set up); without CUDA the trainer joins with gloo.
    out = tmp_path / "acc"
    launch([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
            "-m", "trainer", "--output-dir", str(out), "--steps", "1", *sets(TOKENS)])
    (m,) = rows(out / "metrics.jsonl")
    assert m["ranks"] == 2 and m["rollouts"] == 8
    assert {r["rank"] for r in rows(out / "rollouts.jsonl")} == {0, 1}
    assert (out / "checkpoint" / "config.json").is_file()


@pytest.mark.docker
def test_two_ranks_with_env_server(server, tmp_path):
    """Each rank opens its own sessions on the env server; the prompts come from OpenSession."""
    out = tmp_path / "env"
    launch([*TORCHRUN, "-m", "tests.trainer.dist_run", str(out), *sets([
        "task.name=arithmetic", f"env.address={server.address}", "model.device=cpu", "budget.context=512",
        "budget.per_turn=4", "budget.reserve=0", "budget.max_turns=1", "num_generations=2", "prompts_per_step=2",
        "steps=1", "progress=false", "save_checkpoint=false"])])
    assert_ranks_identical(out)
    rollouts = rows(out / "rollouts.jsonl")
    assert sorted(r["rank"] for r in rollouts) == [0, 0, 1, 1]
    assert all(r["prompt_len"] > 20 and r["status"] == "truncated" for r in rollouts)
    assert len({r["ids_sha1"] for r in rollouts}) == 4
