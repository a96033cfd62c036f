"""Warm start: supervised fine-tuning on demonstrations produced through the real env server.

A demonstration is an ordinary `Rollout`, collected by the ordinary rollout loop
(`RolloutRunner`) with a scripted policy (`ScriptedBackend`) in place of the model:

- the prompt ids come from the server's `OpenSession` (`prompt_ids`);
- each assistant turn is the task's *teacher text* (`TeacherTask.teacher_turn`), encoded with the
  tokenizer. Encoding scripted teacher text is dataset construction, not re-tokenizing model
  output: the invariant (the trainer never decodes and re-encodes what the model generated or the
  env rendered) still holds;
- the tool really runs in the sandbox, and the ids between turns are the server's `suffix_ids`,
  appended verbatim with mask 0. The answer turn states the task's known answer (never text
  taken from a tool message), and the env must score it 1: the sandbox computed the same.

So demonstrations obey the same token contract and have the same ids/mask structure as GRPO
rollouts. A demonstration must complete, call a tool, and (where the env scores) earn reward 1,
or the warm start refuses to train on it. The one exception is a task's *head* demonstration
(`tasks.answers_from_head`: an estimate given without the tool, for a warm start that shows both
behaviours): it must complete without a tool call, and the env must score it 0. The loss is the cross-entropy of the mask-1 tokens
(token-level mean over the batch).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tito.client import EnvironmentClient, RecordingClient
from tito.rollout.generation import GenRequest
from tito.rollout.state import Rollout, Status, TruncationCause
from trainer import report
from trainer.backends.scripted import ScriptedBackend
from trainer.config import TrainConfig, WarmStartConfig
from trainer.model import collate, target_logprobs, trainable
from trainer.rollout import RolloutLimits, RolloutSpec, run_rollouts
from trainer.tasks import TeacherTask, answers_from_head
from trainer.teacher_text import Encode

if TYPE_CHECKING:
    from trainer.setup import Run

log = logging.getLogger(__name__)


WARMSTART_MODEL = "warmstart-model"


class WarmStartError(RuntimeError):
    pass


async def run_warm_start(run: Run, cfg: TrainConfig, limits: RolloutLimits, out: Path) -> None:
    """Demonstrations through the env server (demonstrations.jsonl), SFT on them (warmstart.jsonl
    and .png), then the generation backend gets the new weights."""
    task = run.task
    if not isinstance(task, TeacherTask):
        raise WarmStartError(f"task {task.name!r} has no teacher: set warm_start.steps: 0")
    if run.env is None or not task.uses_env:
        raise WarmStartError("the warm start builds demonstrations through the env server")
    if run.encode_teacher_text is None:
        raise WarmStartError("the warm start needs the tokenizer to encode teacher text")
    encode = run.encode_teacher_text
    if cfg.warm_start.spell_out_markup:
        encode = functools.partial(encode, spell_out=True, keep=run.stop_token_ids)
    t0 = time.perf_counter()
    demos, records = await build_demonstrations(
        task.demo_specs(), task, encode, run.env, cfg.env.environment, run.fingerprint, limits,
        run.stop_token_ids, model=run.model)
    (out / "demonstrations.jsonl").write_text("")
    report.append_jsonl(out / "demonstrations.jsonl", records)
    log.info("warm start: %d demonstrations through the env in %.1fs", len(demos), time.perf_counter() - t0)
    await asyncio.to_thread(warm_start, run.model, demos, cfg.warm_start, pad_id=run.pad_id,
                            device=run.device, out_dir=out, seed=cfg.seed, progress=cfg.progress)
    if cfg.warm_start.save_model:
        run.model.save_pretrained(out / WARMSTART_MODEL)
        log.info("warm start: the policy GRPO starts from is in %s", out / WARMSTART_MODEL)
    run.backend.sync_weights(run.model)


async def build_demonstrations(
    specs: list[RolloutSpec], teacher: TeacherTask, encode: Encode, env: EnvironmentClient, environment: str,
    fingerprint: str, limits: RolloutLimits, stop_token_ids: list[int], model=None,
) -> tuple[list[Rollout], list[dict[str, Any]]]:
    """Run the teacher over `specs` through the env; returns (demonstrations, a record of each).

    `teacher.teacher_turn(meta, turn)` gives the assistant text of each turn.
    With `model`, each demonstration's logprobs are the model's teacher-forced logprobs (for
    inspection; SFT does not use them), else -1.0.
    """
    recorder = RecordingClient(env)
    texts: dict[tuple[int, int], str] = {}

    def script(req: GenRequest) -> list[int]:
        text = teacher.teacher_turn(specs[req.key.spec].meta, req.turn)
        texts[(req.key.spec, req.turn)] = text
        return encode(text)

    rollouts, stats = await run_rollouts(specs, ScriptedBackend(script, model=model), recorder, environment,
                                         fingerprint, limits, stop_token_ids, gen_batch_wait_s=0.01)
    if stats.dropped:
        raise WarmStartError(f"{stats.dropped} demonstration(s) failed: "
                             f"{sorted(set(stats.abort_reasons))[:3]}")
    # Nothing was dropped, so rollouts[i] is specs[i]'s (run_batch keeps the order).
    records, problems = [], []
    for i, r in enumerate(rollouts):
        turns = [texts.get((i, t), "") for t in range(len(r.turns))]
        steps = recorder.steps.get(r.session_id, [])
        records.append({
            "demo": i, "meta": r.meta, "teacher_turns": turns,
            "tool_messages": [m.content for s in steps for m in s.result.tool_messages],
            "env_reward": r.env_reward, **r.summary(),
        })
        why = None
        if r.status is not Status.COMPLETED:
            why = f"{r.status.value}" + (f" ({r.truncation.value})" if r.truncation else "")
            if r.truncation is TruncationCause.LENGTH:
                longest = max(t.generated for t in r.turns) if r.turns else 0
                why += (f": a teacher turn needs more than budget.per_turn / context allows "
                        f"(longest turn so far {longest} tokens)")
        elif answers_from_head(r.meta):
            # A demonstration of answering without the tool: it must not call one, and the env
            # must not accept its estimate (else it would not show that the tool is needed).
            if r.tool_calls:
                why = "the head teacher called a tool"
            elif r.env_reward is not None and r.env_reward > 0.0:
                why = f"the env accepted the head teacher's estimate ({r.env_reward})"
        elif r.tool_calls == 0:
            why = "the teacher never called a tool"
        elif r.env_reward is not None and r.env_reward < 1.0:
            why = f"the env scored the teacher's answer {r.env_reward} (tool said {records[-1]['tool_messages']})"
        if why:
            problems.append(f"demonstration {i} ({r.meta.get('question', '?')}): {why}")
    if problems:
        raise WarmStartError("bad demonstrations:\n  " + "\n  ".join(problems))
    return rollouts, records


def sft_loss(model, rollouts: list[Rollout], pad_id: int, device) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy over the mask-1 (teacher) tokens of the batch, and their count."""
    batch = collate(rollouts, torch.zeros(len(rollouts)), pad_id, device)
    n = int(batch.mask.sum())
    if n == 0:
        raise WarmStartError("demonstrations hold no teacher tokens")
    logp = target_logprobs(model, batch.input_ids, batch.mask, temperature=1.0)
    return -(logp * batch.mask).sum() / n, n


def sft_backward(model, rollouts: list[Rollout], pad_id: int, device, micro: int) -> tuple[float, int]:
    """`sft_loss` of the batch, its gradient accumulated over micro-batches of `micro` demonstrations (only one
    micro-batch's activations alive at a time: a 0.5B model's 8 demonstrations do not fit 24 GB in one)."""
    parts = [collate(rollouts[i:i + micro], torch.zeros(len(rollouts[i:i + micro])), pad_id, device)
             for i in range(0, len(rollouts), micro)]
    n = sum(int(b.mask.sum()) for b in parts)
    if n == 0:
        raise WarmStartError("demonstrations hold no teacher tokens")
    total = 0.0
    for b in parts:  # each part's sum over the whole batch's count: the same gradient as one pass
        loss = -(target_logprobs(model, b.input_ids, b.mask, temperature=1.0) * b.mask).sum() / n
        loss.backward()
        total += float(loss.detach())
    return total, n


def warm_start(model, demos: list[Rollout], cfg: WarmStartConfig, *, pad_id: int, device,
               out_dir: Path | None = None, seed: int = 0, progress: bool = True
               ) -> list[dict[str, Any]]:
    """`cfg.steps` AdamW steps of SFT on `demos`; writes warmstart.jsonl (+ .png) to out_dir."""
    opt = torch.optim.AdamW(trainable(model), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    rng = random.Random(f"warm_start:{seed}")
    bs = cfg.batch_size or len(demos)
    history: list[dict[str, Any]] = []
    path = out_dir / "warmstart.jsonl" if out_dir is not None else None
    if path is not None:
        path.write_text("")
    order: list[Rollout] = []
    model.train()
    try:
        with report.ProgressBar(progress, cfg.steps, "warm start") as bar:
            for step in range(1, cfg.steps + 1):
                t0 = time.perf_counter()
                if bs >= len(demos):
                    batch = demos
                else:
                    if len(order) < bs:  # each demonstration once per epoch, shuffled
                        more = list(demos)
                        rng.shuffle(more)
                        order.extend(more)
                    batch, order = order[:bs], order[bs:]
                opt.zero_grad(set_to_none=True)
                loss, n = sft_backward(model, batch, pad_id, device, cfg.micro_batch_size or len(batch))
                grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
                opt.step()
                m = {"phase": "warm_start", "step": step, "loss": loss,
                     "tokens": n, "demos": len(batch), "grad_norm": grad_norm,
                     "lr": cfg.learning_rate, "step_time_s": time.perf_counter() - t0}
                if not math.isfinite(m["loss"]):
                    raise WarmStartError(f"warm start step {step}: loss is {m['loss']}")
                history.append(m)
                if path is not None:
                    report.append_jsonl(path, [m])
                bar.advance(loss=f"{m['loss']:.3f}")
    finally:
        opt.zero_grad(set_to_none=True)
    if out_dir is not None and history:
        report.plot_warm_start(history, out_dir / "warmstart.png")
    return history

