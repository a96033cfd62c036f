"""The GRPO training loop, top to bottom: rollouts, rewards, advantages, loss, step, metrics.

`setup.open_run` assembles what it works with; the rollout loop (`rollout.py`), the GRPO math
(`grpo.py`), the warm start (`warmstart.py`) and the outputs (`report.py`) are the pieces it calls.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from typing import Any

import torch

from trainer import report
from trainer.config import TrainConfig
from trainer.grpo import LossConfig, group_advantages, grpo_loss
from trainer.model import RolloutBatch, collate, target_logprobs
from trainer.rollout import RolloutLimits, run_rollouts
from trainer.setup import Run
from trainer.warmstart import run_warm_start

log = logging.getLogger(__name__)


async def train(run: Run, cfg: TrainConfig) -> list[dict[str, Any]]:
    """The warm start (if configured), then `cfg.steps` GRPO steps; returns each step's metrics."""
    out = report.start_outputs(cfg)
    limits = RolloutLimits.from_config(cfg)
    if cfg.warm_start.steps > 0:
        await run_warm_start(run, cfg, limits, out)
    # The KL reference is the policy GRPO starts from (the warm-started one, if any).
    ref_model = copy.deepcopy(run.model).eval().requires_grad_(False) if cfg.loss.beta > 0 else None
    optimizer = torch.optim.AdamW(run.model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    history: list[dict[str, Any]] = []
    with report.ProgressBar(cfg.progress, cfg.steps, "grpo") as bar:
        for step in range(1, cfg.steps + 1):
            t0 = time.perf_counter()
            # 1. rollouts through the env: each prompt num_generations times, all concurrently
            prompts = run.task.sample(cfg.prompts_per_step, step)
            specs = [s for s in prompts for _ in range(cfg.num_generations)]
            rollouts, stats = await run_rollouts(specs, run.backend, run.env, cfg.env.environment, limits,
                                                 run.stop_token_ids, gen_batch_wait_s=cfg.gen_batch_wait_s)
            # 2. rewards
            for r in rollouts:
                r.reward = float(run.task.reward(r, run.decode))
            t1 = time.perf_counter()
            update: dict[str, float] = {"loss": float("nan")}
            if not rollouts:
                log.error("step %d: every rollout was dropped (%s)", step,
                          sorted(set(stats.abort_reasons))[:3])
            else:
                # 3. group advantages
                adv = group_advantages(torch.tensor([r.reward for r in rollouts], dtype=torch.float),
                                       torch.tensor([r.group for r in rollouts]),
                                       scale_by_std=cfg.loss.scale_rewards)
                # 4. clipped loss over micro-batches; gradients accumulate with the whole batch's
                # normalisers, so they equal one big batch's
                run.model.train()
                optimizer.zero_grad(set_to_none=True)
                total_tokens = sum(r.num_generated for r in rollouts)
                loss_sum, stat_sums, micro_batches = 0.0, {}, 0
                for i in range(0, len(rollouts), cfg.micro_batch_size):
                    chunk = rollouts[i : i + cfg.micro_batch_size]
                    batch = collate(chunk, adv[i : i + len(chunk)], run.pad_id, run.device)
                    if int(batch.mask.sum()) > 0:
                        # Off the event loop thread: a backward pass of a real model takes long.
                        loss, st = await asyncio.to_thread(micro_batch_backward, run.model, ref_model, batch,
                                                           cfg, len(rollouts), total_tokens)
                        loss_sum, micro_batches = loss_sum + loss, micro_batches + 1
                        stat_sums = {k: stat_sums.get(k, 0.0) + v for k, v in st.items()}
                # 5. optimizer step and weight sync: the generator must sample from the updated policy
                grad_norm = float(torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.max_grad_norm))
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                await asyncio.to_thread(run.backend.sync_weights, run.model)
                update = {"loss": loss_sum, "grad_norm": grad_norm, "adv_abs_mean": float(adv.abs().mean()),
                          **{k: v / micro_batches for k, v in stat_sums.items()}}
            # 6. metrics line, rollout summaries, progress bar
            t2 = time.perf_counter()
            m = {"step": step, **report.rollout_metrics(rollouts, stats), **update,
                 "tokens_per_s": sum(r.num_generated for r in rollouts) / (t1 - t0) if t1 > t0 else 0.0,
                 "rollout_time_s": t1 - t0, "train_time_s": t2 - t1, "step_time_s": t2 - t0}
            history.append(m)
            report.append_jsonl(out / "rollouts.jsonl", ({"step": step, **r.summary()} for r in rollouts))
            report.append_jsonl(out / "metrics.jsonl", [m])
            bar.advance(reward=f"{m['reward_mean']:.3f}", trunc=f"{m['truncated_frac']:.2f}",
                        tools=f"{m['tool_calls_mean']:.1f}", s=f"{m['step_time_s']:.1f}")
    report.plot_metrics(history, out / "metrics.png")
    if cfg.save_checkpoint:
        (out / "checkpoint").mkdir(parents=True, exist_ok=True)
        run.model.save_pretrained(out / "checkpoint")
        torch.save(optimizer.state_dict(), out / "checkpoint" / "optimizer.pt")
    return history


def micro_batch_backward(model, ref_model, batch: RolloutBatch, cfg: TrainConfig, total_sequences: int,
                         total_tokens: int) -> tuple[float, dict[str, float]]:
    """Stage 4 for one micro-batch: logprobs under the policy (and the reference), the clipped
    loss, backward. Returns the loss and its statistics."""
    temperature = cfg.temperature
    loss_cfg = LossConfig(cfg.loss.clip_eps_low, cfg.loss.clip_eps_high, cfg.loss.beta, cfg.loss.norm)
    old = batch.old_logp
    if cfg.loss.old_logprobs == "recompute":
        with torch.no_grad():
            old = target_logprobs(model, batch.input_ids, batch.mask, temperature)
    ref = None
    if ref_model is not None:
        with torch.no_grad():
            ref = target_logprobs(ref_model, batch.input_ids, batch.mask, temperature)
    logp = target_logprobs(model, batch.input_ids, batch.mask, temperature)
    loss, stats = grpo_loss(logp, old, batch.advantages, batch.mask, loss_cfg, ref,
                            total_sequences=total_sequences, total_tokens=total_tokens)
    loss.backward()
    return float(loss.detach()), stats
