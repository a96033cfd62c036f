"""Checkpoints and resume: a run killed after a checkpoint and resumed takes the same next step
(same rollouts, loss, weights) as a run that was never interrupted, and its files continue.

Generation is deterministic per rollout (per-request seeds), so this holds for env tasks too; the
subprocess test uses the no-env task to stay fast.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainer import checkpoint, report
from trainer.backends.hf import TransformersBackend
from trainer.config import load_config
from trainer.model import build_tiny_qwen3
from trainer.setup import Run
from trainer.tasks import TokenSubsetTask
from trainer.train import train

REPO = Path(__file__).resolve().parents[2]
RUN = ["--set", "task.name=token_subset", "--set", "task.params={fraction: 0.5, prompt_len: 8}",
       "--set", "model.vocab_size=2048", "--set", "model.device=cpu", "--set", "budget.context=40",
       "--set", "budget.per_turn=16", "--set", "budget.reserve=0", "--set", "budget.max_turns=1",
       "--set", "num_generations=4", "--set", "prompts_per_step=2", "--set", "learning_rate=0.03",
       "--set", "seed=2", "--set", "progress=false", "--report-to", "tensorboard"]
# What a step computes; timings are left out.
KEYS = ("step", "rollouts", "reward_mean", "reward_std", "gen_tokens_mean", "loss", "grad_norm", "clip_frac",
        "ratio_mean", "adv_abs_mean")


def trainer(out: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "trainer", "--output-dir", str(out), *RUN, *args], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> None:
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-4000:]


def steps_of(out: Path) -> list[tuple]:
    return [tuple(m[k] for k in KEYS) for m in report.read_jsonl(out / "metrics.jsonl")]


def tensorboard_steps(out: Path, tag: str = "train/reward_mean") -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_killed_run_resumes_into_the_same_next_step(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    finish(trainer(straight, "--steps", "3"))

    # Many steps, a checkpoint every 2: killed (SIGKILL) as soon as step 2's checkpoint is complete.
    proc = trainer(killed, "--steps", "50", "--set", "save_steps=2", "--set", "save_total_limit=50")
    ckpt = killed / "checkpoints" / "step-000002"
    deadline = time.monotonic() + 300
    while not (ckpt / checkpoint.STATE).exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    finish(trainer(killed, "--steps", "3", "--resume", str(ckpt)))
    assert steps_of(killed) == steps_of(straight)  # step 3 the same; steps 1-2 once each
    assert [m["step"] for m in report.read_jsonl(killed / "metrics.jsonl")] == [1, 2, 3]
    rollouts = [(r["step"], r["ids_sha1"], r["reward"]) for r in report.read_jsonl(killed / "rollouts.jsonl")]
    assert rollouts == [(r["step"], r["ids_sha1"], r["reward"]) for r in report.read_jsonl(straight / "rollouts.jsonl")]
    a, b = load_file(straight / "checkpoint" / "model.safetensors"), load_file(killed / "checkpoint" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert checkpoint.resolve(killed).name == "step-000003"
    assert not (killed / "checkpoints" / "step-000004").exists()  # the abandoned timeline is gone
    # TensorBoard continues the curve: events the killed run logged after step 2 are purged.
    assert tensorboard_steps(killed) == tensorboard_steps(straight)


def make_run(init_seed: int = 0) -> Run:
    """The task is the config's (seed 0); the weights and the sampler's generator start from
    init_seed, which a resume must overwrite."""
    model = build_tiny_qwen3(vocab_size=256, seed=init_seed)
    task = TokenSubsetTask(vocab_size=256, seed=0, prompt_len=6)
    return Run(model=model, backend=TransformersBackend(model, seed=init_seed), task=task, env=None,
               stop_token_ids=[], pad_id=0)


def config(out: Path, *extra: str):
    return load_config(None, [
        "task.name=token_subset", "budget.context=24", "budget.per_turn=8", "budget.reserve=0", "budget.max_turns=1",
        "num_generations=4", "prompts_per_step=2", "learning_rate=0.05", "progress=false", "loss.beta=0.1",
        "loss.old_logprobs=recompute", "seed_per_request=false", f"output_dir={out}", *extra])


def test_resume_restores_reference_optimizer_and_shared_sampler(tmp_path):
    """In process, with a KL reference (saved in ref/) and the backend's shared generator (no
    per-request seeds, so its RNG state must come back too): the same steps 3 and 4."""
    straight = asyncio.run(train(make_run(), config(tmp_path / "a", "steps=4")))
    asyncio.run(train(make_run(), config(tmp_path / "b", "steps=2")))
    assert (tmp_path / "b" / "checkpoint" / "ref" / "model.safetensors").is_file()
    run = make_run(init_seed=5)  # other weights and sampler state: all must come from the checkpoint
    resumed = asyncio.run(train(run, config(tmp_path / "b", "steps=4", f"resume_from={tmp_path / 'b'}")))
    keys = KEYS + ("kl",)
    assert [tuple(m[k] for k in keys) for m in resumed] == [tuple(m[k] for k in keys) for m in straight]
    assert [m["step"] for m in report.read_jsonl(tmp_path / "b" / "metrics.jsonl")] == [1, 2, 3, 4]


def test_resolve_and_latest_link(tmp_path):
    asyncio.run(train(make_run(), config(tmp_path, "steps=3", "save_steps=1", "save_total_limit=2", "loss.beta=0")))
    steps = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert steps == ["step-000002", "step-000003"]  # save_total_limit
    assert (tmp_path / "checkpoint").is_symlink() and (tmp_path / "checkpoint" / "config.json").is_file()
    assert checkpoint.resolve(tmp_path) == (tmp_path / "checkpoints" / "step-000003").resolve()
    assert checkpoint.resolve(tmp_path / "checkpoints" / "step-000002").name == "step-000002"
    state = json.loads((tmp_path / "checkpoint" / checkpoint.STATE).read_text())
    assert state["step"] == 3 and [m["step"] for m in state["history"]] == [1, 2, 3]
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        checkpoint.resolve(tmp_path / "nowhere")


def test_rewind_outputs_drops_lines_after_the_checkpoint(tmp_path):
    report.append_jsonl(tmp_path / "rollouts.jsonl", [{"step": s, "reward": 0.5} for s in (1, 1, 2, 3, 3)])
    report.append_jsonl(tmp_path / "metrics.jsonl", [{"step": s} for s in (1, 2, 3)])
    report.rewind_outputs(tmp_path, [{"step": 1, "loss": float("nan")}, {"step": 2, "loss": 0.5}], 2)
    assert [r["step"] for r in report.read_jsonl(tmp_path / "rollouts.jsonl")] == [1, 1, 2]
    assert report.read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1, "loss": None}, {"step": 2, "loss": 0.5}]


def test_load_weights_refuses_another_model(tmp_path):
    build_tiny_qwen3(vocab_size=256).save_pretrained(tmp_path)
    model = build_tiny_qwen3(vocab_size=256, seed=9)
    checkpoint.load_weights(model, tmp_path)  # tied lm_head: absent from the file, fine
    assert torch.equal(model.lm_head.weight, build_tiny_qwen3(vocab_size=256).lm_head.weight)
    with pytest.raises(ValueError, match="does not fit"):
        checkpoint.load_weights(build_tiny_qwen3(vocab_size=256, layers=3), tmp_path)
