"""distributed.strategy: fsdp on CPU: two real processes (torchrun, gloo), FSDP2's real collectives.

- Two fsdp ranks take the same steps as one process with the whole batch (replicate, no
  activation checkpointing): same rollouts and rewards, losses within 1e-6, grad norms within 1e-5
  (relative), weights after two steps within 1e-3, 99.5% of them within 1e-5 (Adam: see the
  test). float32 compute (distributed.param_dtype), so the
  comparison is about sharding, not bf16 rounding. The fsdp run has activation checkpointing, a KL
  reference (sharded too), and an odd number of prompt groups with micro_batch_size 4, so rank 1
  has one micro-batch less than rank 0 and runs a filler pass (it would hang otherwise).
- Resumed from its sharded (DCP) step-2 checkpoint, step 3 is bit for bit the uninterrupted one.
- The DCP checkpoint exports to a save_pretrained folder holding the same weights.
- After an fsdp step, each rank's vLLM engine (CPU build) samples from the new weights.
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
from safetensors.torch import load_file

from tests.trainer.test_distributed import TORCHRUN, assert_adam_close, launch, rows, sets
from trainer import checkpoint, distributed
from trainer.config import ConfigError, load_config
from trainer.export import export
from trainer.setup import open_run
from trainer.train import train

BATCH = ["task.name=token_subset", "task.params={fraction: 0.5, prompt_len: 8}", "model.vocab_size=2048",
         "model.device=cpu", "budget.context=40", "budget.per_turn=16", "budget.reserve=0", "budget.max_turns=1",
         "num_generations=4", "prompts_per_step=3", "micro_batch_size=4", "learning_rate=0.03", "loss.beta=0.1",
         "progress=false", "seed=1"]
FSDP = ["distributed.strategy=fsdp", "distributed.param_dtype=float32", "model.activation_checkpointing=true"]
KEYS = ("step", "rollouts", "reward_mean", "gen_tokens_mean", "loss", "grad_norm", "clip_frac", "ratio_mean", "kl")


def single_process(out: Path, *extra: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
    cfg = load_config(None, [*BATCH, "save_checkpoint=false", *extra], {"output_dir": str(out)})

    async def go():
        async with open_run(cfg) as run:
            history = await train(run, cfg)
            return history, {k: v.detach().clone() for k, v in run.model.state_dict().items()}

    return asyncio.run(go())


def test_fsdp_equals_one_process_and_resumes_from_sharded_checkpoint(tmp_path):
    straight, resumed = tmp_path / "fsdp", tmp_path / "resumed"
    launch([*TORCHRUN, "-m", "tests.trainer.dist_run", str(straight),
            *sets([*BATCH, *FSDP, "steps=3", "save_steps=2", "save_total_limit=2"])])
    metrics = rows(straight / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3] and all(m["ranks"] == 2 for m in metrics)
    ckpt = straight / "checkpoints" / "step-000002"
    assert (ckpt / checkpoint.SHARDED / ".metadata").is_file() and not (ckpt / "model.safetensors").exists()

    # One process, the whole batch, two steps: the same as the first two fsdp steps.
    history, single = single_process(tmp_path / "one", "steps=2")
    for a, b in zip(history, metrics[:2]):
        assert a["reward_mean"] == b["reward_mean"] and a["gen_tokens_mean"] == b["gen_tokens_mean"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["kl"] == pytest.approx(b["kl"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)  # float32 sums in another order
    exported = load_file(export(ckpt, tmp_path / "export") / "model.safetensors")
    assert exported.keys() <= single.keys() and "lm_head.weight" not in exported  # tied, as save_pretrained does
    assert_adam_close(exported, single)

    # Resumed from the sharded step-2 checkpoint: step 3 as the uninterrupted run took it.
    launch([*TORCHRUN, "-m", "tests.trainer.dist_run", str(resumed),
            *sets([*BATCH, *FSDP, "steps=3", f"resume_from={ckpt}"])])
    assert [tuple(m[k] for k in KEYS) for m in rows(resumed / "metrics.jsonl")] == \
        [tuple(m[k] for k in KEYS) for m in metrics]
    for rank in (0, 1):
        a, b = torch.load(straight / f"rank{rank}.pt"), torch.load(resumed / f"rank{rank}.pt")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.vllm
def test_vllm_engines_sample_from_the_weights_of_an_fsdp_step(tmp_path):
    """Each rank pushes the gathered parameters into its own engine (one at a time) after the step:
    the engines' logprobs then match the trained weights, not the initial ones."""
    pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs its CPU build)")
    out = tmp_path / "vllm"
    env_keys = ("VLLM_NO_USAGE_STATS", "HF_HUB_OFFLINE")
    os.environ.update({k: "1" for k in env_keys if k not in os.environ})
    launch([*TORCHRUN, "-m", "tests.trainer.dist_run", str(out), "--engine-check",
            *sets([*BATCH[:2], "model.device=cpu", "budget.context=40", "budget.per_turn=16", "budget.reserve=0",
                   "budget.max_turns=1", "num_generations=4", "prompts_per_step=2", "learning_rate=0.03",
                   "progress=false", "seed=1", "steps=1", "save_checkpoint=false", "backend=vllm",
                   "model.head_dim=32", "distributed.strategy=fsdp", "distributed.param_dtype=float32"])])
    (m,) = rows(out / "metrics.jsonl")
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # the first push (from the shards) was right too
    for rank in (0, 1):
        errors = json.loads((out / f"engine{rank}.json").read_text())
        assert errors["trained"] < 1e-4 and errors["initial"] > 1e-2, errors


def test_activation_checkpointing_changes_memory_not_results():
    """One micro-step of the loss (policy + KL reference) with and without it: the same loss and
    gradients, less tensor memory at the peak (trainer.memory.PeakTensorMemory)."""
    from trainer.memory import PeakTensorMemory
    from trainer.model import build_tiny_qwen3, enable_activation_checkpointing
    from trainer.train import micro_batch_backward

    cfg = load_config(None, ["loss.beta=0.1", "loss.old_logprobs=recompute"])
    ids = torch.randint(0, 1024, (4, 192), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(4, 191, dtype=torch.long)
    mask[:, :32] = 0
    from trainer.model import RolloutBatch

    batch = RolloutBatch(input_ids=ids, mask=mask, old_logp=torch.full((4, 191), float("nan")),
                         advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]))
    outcome = {}
    for checkpointed in (False, True):
        model = build_tiny_qwen3(vocab_size=1024, seed=0, layers=4, hidden=128, intermediate=256)
        ref = build_tiny_qwen3(vocab_size=1024, seed=1, layers=4, hidden=128, intermediate=256).eval()
        if checkpointed:
            enable_activation_checkpointing(model)
        model.train()
        with PeakTensorMemory() as memory:
            loss, stats = micro_batch_backward(model, ref, batch, cfg, total_sequences=4, total_tokens=int(mask.sum()))
        outcome[checkpointed] = loss, stats, {n: p.grad.clone() for n, p in model.named_parameters()}, memory.peak
    (loss0, stats0, grads0, peak0), (loss1, stats1, grads1, peak1) = outcome[False], outcome[True]
    assert loss1 == pytest.approx(loss0, abs=1e-7) and stats1 == pytest.approx(stats0, abs=1e-7)
    for name in grads0:
        torch.testing.assert_close(grads1[name], grads0[name], atol=1e-6, rtol=1e-5)
    print(f"peak tensor memory of the micro-step: {peak0 / 2**20:.1f} MiB without, {peak1 / 2**20:.1f} MiB with")
    assert peak1 < 0.6 * peak0


@pytest.mark.parametrize("overrides,message", [
    (["distributed.strategy=fsdp", "warm_start.steps=2"], "warm_start.steps > 0 needs distributed.strategy: replicate"),
    (["distributed.cpu_offload=true"], "distributed.cpu_offload applies to strategy fsdp only"),
    (["distributed.param_dtype=bfloat16"], "distributed.param_dtype applies to strategy fsdp only"),
    (["distributed.strategy=fsdp", "distributed.cpu_offload=true", "model.device=cpu"], "with model.device: cpu it is"),
    (["distributed.strategy=ddp"], "distributed.strategy"),
    (["backend=vllm", "transformers.sampler=static"], "the transformers section configures backend transformers"),
])
def test_config_errors_say_what_to_do(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_fsdp_without_a_launcher_is_refused():
    # In a fresh process: a test before this one in the same pytest process may have left a process group
    # (TRL's colocated vLLM makes one), and a process in a group is not refused.
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    code = ("from trainer import distributed\n"
            "from trainer.config import ConfigError\n"
            "try:\n    distributed.init('cpu', fsdp=True)\nexcept ConfigError as e:\n    print('refused:', e)\n"
            "assert distributed.init('cpu') == distributed.Dist()  # replicate alone: no group, as before\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("refused:") and "torchrun --nproc-per-node N" in out.stdout, out.stdout


def test_resume_refuses_another_strategy(tmp_path):
    """A replicate checkpoint is not resumed by an fsdp run (nor the reverse): the message names both."""
    single_process(tmp_path / "r", "steps=1", "save_checkpoint=true", "loss.beta=0")
    state = json.loads((tmp_path / "r" / "checkpoint" / checkpoint.STATE).read_text())
    assert state["strategy"] == "replicate"
    run = type("Run", (), {"model": torch.nn.Linear(1, 1), "dist": distributed.Dist()})()
    state["strategy"] = "fsdp"
    (tmp_path / "r" / "checkpoint" / checkpoint.STATE).write_text(json.dumps(state))
    with pytest.raises(ConfigError, match="saved by distributed.strategy fsdp, and this run uses replicate"):
        checkpoint.restore(tmp_path / "r", run, None, None, tmp_path / "r")


def test_export_copies_a_replicate_checkpoint(tmp_path):
    single_process(tmp_path / "r", "steps=1", "save_checkpoint=true", "loss.beta=0")
    out = export(tmp_path / "r", tmp_path / "out")
    assert (out / "model.safetensors").is_file() and not (out / "optimizer.pt").exists()
    assert sys.modules["trainer.export"].main([str(tmp_path / "nowhere"), str(tmp_path / "x")]) == 2
