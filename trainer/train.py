"""The GRPO training loop, top to bottom: rollouts, rewards, advantages, loss, step, metrics.

`setup.open_run` assembles what it works with; the rollout loop (`rollout.py`), the GRPO math
(`grpo.py`), the warm start (`warmstart.py`), the outputs (`report.py`, `trackers.py`), the ranks
(`distributed.py`, `fsdp.py`) and checkpoints (`checkpoint.py`) are the pieces it calls. With several
processes every rank runs this same loop on its share of the prompts.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from typing import Any

import torch

from trainer import checkpoint, fsdp, report
from trainer.backends.seeding import StepSeeds
from trainer.config import TrainConfig
from trainer.grpo import LossConfig, group_advantages, grpo_loss
from trainer.model import (RolloutBatch, collate, enable_activation_checkpointing, filler_batch, target_logprobs,
                           trainable)
from trainer.rollout import RolloutLimits, run_rollouts
from trainer.setup import Run
from trainer.trackers import Trackers
from trainer.warmstart import run_warm_start

log = logging.getLogger(__name__)


async def train(run: Run, cfg: TrainConfig) -> list[dict[str, Any]]:
    """The warm start (if configured) or the checkpoint to resume from, then GRPO steps up to
    `cfg.steps`; returns each step's metrics (on rank 0; other ranks return an empty list)."""
    dist = run.dist
    out = report.start_outputs(cfg, dist.is_main)
    limits = RolloutLimits.from_config(cfg)
    # 0. the policy GRPO starts from: warm-started (on rank 0), or restored from a checkpoint
    warm = cfg.warm_start.steps > 0 and not cfg.resume_from
    if warm and dist.is_main:
        await run_warm_start(run, cfg, limits, out)
    ref_model = prepare_policy(run, cfg)
    optimizer = torch.optim.AdamW(trainable(run.model), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    done, history = checkpoint.restore(cfg.resume_from, run, optimizer, ref_model, out) \
        if cfg.resume_from else (0, [])
    with Trackers(cfg, out, start_step=done + 1, warm_start=warm, enabled=dist.is_main) as trackers, \
            report.ProgressBar(cfg.progress and dist.is_main, cfg.steps, "grpo", initial=done) as bar:
        for step in range(done + 1, cfg.steps + 1):
            t0 = time.perf_counter()
            # 1. rollouts through the env: this rank's share of the prompts, each num_generations
            # times, all concurrently (seeded per request: samples depend neither on the batching
            # nor on the rank)
            prompts = dist.shard(run.task.sample(cfg.prompts_per_step, step))
            specs = [s for s in prompts for _ in range(cfg.num_generations)]
            backend = StepSeeds(run.backend, seed=cfg.seed, step=step, specs=specs) \
                if cfg.seed_per_request else run.backend
            rollouts, stats = await run_rollouts(specs, backend, run.env, cfg.env.environment, run.fingerprint,
                                                 limits, run.stop_token_ids, gen_batch_wait_s=cfg.gen_batch_wait_s)
            # 2. rewards
            for r in rollouts:
                r.reward = float(run.task.reward(r, run.decode))
            t1 = time.perf_counter()
            part = report.StepPart([report.rollout_record(r, dist.rank, run.decode) for r in rollouts], stats)
            # The whole batch (every rank's) sets the loss normalisers and whether to update at all.
            total_rollouts, total_tokens = (int(x) for x in dist.sum(len(rollouts),
                                                                     sum(r.num_generated for r in rollouts)))
            grad_norm = None
            if total_rollouts == 0:
                log.error("step %d: every rollout was dropped (%s)", step, sorted(set(stats.abort_reasons))[:3])
            else:
                run.backend.release_memory()  # a colocated vLLM sleeps while the policy trains
                # 3. group advantages (a group's rollouts are all on one rank)
                adv = group_advantages(torch.tensor([r.reward for r in rollouts], dtype=torch.float),
                                       torch.tensor([r.group for r in rollouts], dtype=torch.long),
                                       scale_by_std=cfg.loss.scale_rewards)
                part.adv_abs_sum = float(adv.abs().sum())
                # 4. clipped loss over micro-batches; gradients accumulate with the whole batch's
                # normalisers, so they equal one big batch's
                run.model.train()
                optimizer.zero_grad(set_to_none=True)
                mbs = cfg.micro_batch_size
                batches = [collate(rollouts[i : i + mbs], adv[i : i + mbs], run.pad_id, run.device)
                           for i in range(0, len(rollouts), mbs)]
                batches = [b for b in batches if int(b.mask.sum()) > 0]  # nothing generated: nothing to train
                # fsdp: every pass is collective, so every rank runs as many micro-batches as the
                # busiest one, the extra ones training on nothing (model.filler_batch)
                fillers = dist.max(len(batches)) - len(batches) if cfg.fsdp else 0
                passes = [(b, 1.0) for b in batches] + [(filler_batch(run.pad_id, run.device), 0.0)] * fillers
                for batch, weight in passes:
                    # Off the event loop thread: a backward pass of a real model takes long.
                    loss, st = await asyncio.to_thread(micro_batch_backward, run.model, ref_model, batch,
                                                       cfg, total_rollouts, total_tokens, weight)
                    if weight:
                        part.loss, part.micro_batches = part.loss + loss, part.micro_batches + 1
                        part.loss_stats = {k: part.loss_stats.get(k, 0.0) + v for k, v in st.items()}
                # 5. gradients summed over the ranks (fsdp: reduce-scattered during backward),
                # optimizer step, weight sync: the generator must sample from the updated policy
                if not cfg.fsdp:
                    dist.all_reduce_grads(run.model)
                grad_norm = fsdp.grad_norm(run.model, cfg.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                await asyncio.to_thread(run.backend.sync_weights, run.model)
            # 6. metrics line over every rank's rollouts (rank 0 writes), checkpoint
            parts = dist.gather(part)
            if dist.is_main:
                m = report.step_metrics(step, parts, grad_norm, t1 - t0, time.perf_counter() - t1)
                history.append(m)
                report.append_jsonl(out / "rollouts.jsonl", ({"step": step, **r} for p in parts for r in p.rollouts))
                report.append_jsonl(out / "metrics.jsonl", [m])
                trackers.log(m, step)
                bar.advance(reward=f"{m['reward_mean']:.3f}", trunc=f"{m['truncated_frac']:.2f}",
                            tools=f"{m['tool_calls_mean']:.1f}", s=f"{m['step_time_s']:.1f}")
            if checkpoint.due(step, cfg):
                checkpoint.save(out, step, run, optimizer, ref_model, cfg, history)
    if not dist.is_main:
        return []
    report.plot_metrics(history, out / "metrics.png")
    return history


def prepare_policy(run, cfg: TrainConfig):
    """The policy as it trains, and the frozen KL reference (None with loss.beta 0): the same
    weights on every rank (replicate: rank 0's broadcast; fsdp: rank 0's loaded into every rank's
    shards, the policy's and the reference's), activation checkpointing if asked, and the
    generation backend holding them."""
    dist = run.dist
    if cfg.model.activation_checkpointing:
        enable_activation_checkpointing(run.model)
    if not cfg.fsdp:
        dist.broadcast_model(run.model)  # every rank starts from rank 0's weights
        # The KL reference is the policy GRPO starts from (the warm-started one, if any).
        ref_model = copy.deepcopy(run.model).eval().requires_grad_(False) if cfg.loss.beta > 0 else None
        if dist.enabled:
            run.backend.sync_weights(run.model)
        return ref_model
    d = cfg.distributed
    settings = dict(device=run.device, param_dtype=cfg.compute_dtype, reduce_dtype=d.reduce_dtype or "float32",
                    cpu_offload=d.cpu_offload)
    # Rank 0 holds the whole model, the others a skeleton. Aliases, not the parameters themselves:
    # sharding turns those into DTensors.
    full = {k: v.detach() for k, v in run.model.state_dict().items()} if dist.is_main else {}
    buffers = {k: v.detach().clone() for k, v in run.model.named_buffers()} if dist.is_main else {}
    ref_model = fsdp.meta_skeleton(run.model) if cfg.loss.beta > 0 else None
    fsdp.shard(run.model, full_state=full, full_buffers=buffers, **settings)
    if ref_model is not None:
        fsdp.shard(ref_model.requires_grad_(False), full_state=full, full_buffers=buffers, **settings).eval()
    del full, buffers
    run.backend.sync_weights(run.model)
    return ref_model


def micro_batch_backward(model, ref_model, batch: RolloutBatch, cfg: TrainConfig, total_sequences: int,
                         total_tokens: int, weight: float = 1.0) -> tuple[float, dict[str, float]]:
    """Stage 4 for one micro-batch: logprobs under the policy (and the reference), the clipped
    loss, backward. Returns the loss and its statistics. `weight` 0 makes a pass that changes no
    gradient but still runs every layer forward and backward (fsdp's filler micro-batches)."""
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
    (loss if weight == 1.0 else loss * weight).backward()
    return float(loss.detach()), stats
