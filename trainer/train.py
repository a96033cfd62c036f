"""The GRPO training loop: rollouts against the env server, group advantages, clipped loss."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from trainer.backends.base import GenerationBackend
from trainer.config import TrainConfig
from trainer.env_client import EnvClient, EnvError, GrpcEnvClient
from trainer.grpo import LossConfig, group_advantages, grpo_loss
from trainer.model import collate, load_model, target_logprobs
from trainer.rollout import BatchStats, GenerationScheduler, RolloutLimits, RolloutRunner, RolloutSpec
from trainer.state import Rollout, Status, TruncationCause
from trainer.tasks import Task, make_task

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@dataclass
class TokenizerInfo:
    files: dict[str, bytes]
    vocab_size: int
    pad_id: int
    eos_ids: list[int]
    _tok: Any = None

    @classmethod
    def load(cls, cfg: TrainConfig) -> TokenizerInfo:
        from tokenizers import Tokenizer

        from tito.fingerprint import read_tokenizer_files

        if cfg.tokenizer.dir:
            directory = Path(cfg.tokenizer.dir)
        else:
            from tito_assets.qwen_tokenizer import build_tokenizer_dir

            # One-off setup: the offline Qwen tokenizer with a trl chat template (no hub).
            directory = build_tokenizer_dir(template=cfg.tokenizer.template)
        files = read_tokenizer_files(directory)
        tok = Tokenizer.from_str(files["tokenizer.json"].decode())
        tcfg = json.loads(files.get("tokenizer_config.json", b"{}"))
        eos_ids = []
        for key in ("eos_token", "pad_token"):
            value = tcfg.get(key)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str) and tok.token_to_id(value) is not None:
                eos_ids.append(tok.token_to_id(value))
        pad = eos_ids[-1] if eos_ids else 0
        return cls(files=files, vocab_size=tok.get_vocab_size(with_added_tokens=True), pad_id=pad,
                   eos_ids=eos_ids[:1], _tok=tok)

    def decode(self, ids: list[int]) -> str:
        # Only for rewards and logs; ids are never re-encoded.
        return self._tok.decode(ids, skip_special_tokens=False)

    def encode_teacher_text(self, text: str) -> list[int]:
        """Scripted teacher text for warm-start demonstrations (dataset text, never model
        output or env text). Special tokens written in the text (`<tool_call>`, `<|im_end|>`)
        become their ids."""
        return self._tok.encode(text, add_special_tokens=False).ids


@dataclass
class StepMetrics:
    values: dict[str, Any] = field(default_factory=dict)


def rollout_metrics(rollouts: list[Rollout], stats: BatchStats) -> dict[str, Any]:
    n = len(rollouts)
    rewards = [r.reward for r in rollouts if r.reward is not None]

    def frac(pred) -> float:
        return sum(1 for r in rollouts if pred(r)) / n if n else float("nan")

    def mean(xs) -> float:
        xs = list(xs)
        return sum(xs) / len(xs) if xs else float("nan")

    return {
        "rollouts": n,
        "reward_mean": mean(rewards),
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "completed_frac": frac(lambda r: r.status is Status.COMPLETED),
        "truncated_frac": frac(lambda r: r.status is Status.TRUNCATED),
        "truncated_length_frac": frac(lambda r: r.truncation is TruncationCause.LENGTH),
        "truncated_tool_overflow_frac": frac(lambda r: r.truncation is TruncationCause.TOOL_OVERFLOW),
        "truncated_max_turns_frac": frac(lambda r: r.truncation is TruncationCause.MAX_TURNS),
        # Share of rollout attempts that aborted (env failure, missing logprobs, ...).
        "aborted_frac": stats.aborted_attempts / stats.attempts if stats.attempts else 0.0,
        "dropped": stats.dropped,
        "tool_calls_mean": mean(r.tool_calls for r in rollouts),
        "turns_mean": mean(len(r.turns) for r in rollouts),
        "gen_tokens_mean": mean(r.num_generated for r in rollouts),
        "len_mean": mean(len(r.ids) for r in rollouts),
    }


class Trainer:
    def __init__(self, cfg: TrainConfig, *, model, backend: GenerationBackend, task: Task,
                 env: EnvClient | None, stop_token_ids: list[int], pad_id: int,
                 decode=None, device: torch.device | None = None, encode=None) -> None:
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.task = task
        self.env = env
        self.stop_token_ids = list(stop_token_ids)
        self.pad_id = pad_id
        self.decode = decode
        self.encode = encode  # teacher text -> ids, for warm-start demonstrations only
        self.device = device or next(model.parameters()).device
        self.out = Path(cfg.output_dir)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate,
                                           weight_decay=cfg.weight_decay)
        self.loss_cfg = LossConfig(cfg.loss.clip_eps_low, cfg.loss.clip_eps_high, cfg.loss.beta,
                                   cfg.loss.norm)
        self.ref_model = None
        if cfg.loss.beta > 0 and cfg.warm_start.steps == 0:
            # With a warm start the reference is taken after it (see warm_start()).
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.limits = RolloutLimits(
            budget=cfg.budget.context, per_turn_cap=cfg.budget.per_turn, reserve=cfg.budget.reserve,
            max_turns=cfg.budget.max_turns, temperature=cfg.temperature, retries=cfg.retries,
        )
        self.history: list[dict[str, Any]] = []
        self.warm_history: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ warm start
    async def warm_start(self) -> list[dict[str, Any]]:
        """SFT on demonstrations collected through the env server (trainer/warmstart.py)."""
        from trainer.warmstart import WarmStartError, build_demonstrations, warm_start

        ws = self.cfg.warm_start
        if not (hasattr(self.task, "demo_specs") and hasattr(self.task, "teacher_turn")):
            raise WarmStartError(f"task {self.task.name!r} has no teacher: set warm_start.steps: 0")
        if self.env is None or not self.task.uses_env:
            raise WarmStartError("the warm start builds demonstrations through the env server")
        if self.encode is None:
            raise WarmStartError("the warm start needs the tokenizer to encode teacher text")
        t0 = time.perf_counter()
        demos, records = await build_demonstrations(
            self.task.demo_specs(), self.task, self.encode, self.env, self.cfg.env.environment,
            self.limits, self.stop_token_ids, model=self.model)
        with open(self.out / "demonstrations.jsonl", "w") as f:
            for rec in records:
                f.write(json.dumps(_jsonable(rec)) + "\n")
        log.info("warm start: %d demonstrations through the env in %.1fs", len(demos),
                 time.perf_counter() - t0)
        self.warm_history = await asyncio.to_thread(
            warm_start, self.model, demos, ws, pad_id=self.pad_id, device=self.device,
            out_dir=self.out, seed=self.cfg.seed, progress=self.cfg.progress)
        self.backend.sync_weights(self.model)
        if self.cfg.loss.beta > 0:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        return self.warm_history

    # ------------------------------------------------------------------ rollouts
    def expand(self, specs: list[RolloutSpec]) -> list[RolloutSpec]:
        return [RolloutSpec(group=s.group, messages=s.messages, env_args=s.env_args,
                            prompt_ids=s.prompt_ids, meta=s.meta)
                for s in specs for _ in range(self.cfg.num_generations)]

    async def collect(self, step: int) -> tuple[list[Rollout], BatchStats]:
        specs = self.expand(self.task.sample(self.cfg.prompts_per_step, step))
        scheduler = GenerationScheduler(self.backend, max_wait_s=self.cfg.gen_batch_wait_s)
        runner = RolloutRunner(self.limits, scheduler, self.env if self.task.uses_env else None,
                               self.cfg.env.environment, self.stop_token_ids)
        try:
            rollouts, stats = await runner.run_batch(specs)
        finally:
            await scheduler.close()
        for r in rollouts:
            r.reward = float(self.task.reward(r, self.decode))
        return rollouts, stats

    # ------------------------------------------------------------------ update
    def update(self, rollouts: list[Rollout]) -> dict[str, float]:
        rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float)
        groups = torch.tensor([r.group for r in rollouts])
        adv = group_advantages(rewards, groups, scale_by_std=self.cfg.loss.scale_rewards)
        total_tokens = sum(r.num_generated for r in rollouts)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, stats_acc, mbs = 0.0, {}, 0
        temp = self.cfg.temperature
        for i in range(0, len(rollouts), self.cfg.micro_batch_size):
            chunk = rollouts[i : i + self.cfg.micro_batch_size]
            batch = collate(chunk, adv[i : i + len(chunk)], self.pad_id, self.device)
            if int(batch.mask.sum()) == 0:
                continue
            old = batch.old_logp
            if self.cfg.loss.old_logprobs == "recompute":
                with torch.no_grad():
                    old = target_logprobs(self.model, batch.input_ids, batch.mask, temp)
            ref = None
            if self.ref_model is not None:
                with torch.no_grad():
                    ref = target_logprobs(self.ref_model, batch.input_ids, batch.mask, temp)
            logp = target_logprobs(self.model, batch.input_ids, batch.mask, temp)
            loss, st = grpo_loss(logp, old, batch.advantages, batch.mask, self.loss_cfg, ref,
                                 total_sequences=len(rollouts), total_tokens=total_tokens)
            loss.backward()
            loss_sum += float(loss.detach())
            mbs += 1
            for k, v in st.items():
                stats_acc[k] = stats_acc.get(k, 0.0) + v
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                          self.cfg.max_grad_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        # The generator must sample from the updated policy.
        self.backend.sync_weights(self.model)
        out = {"loss": loss_sum, "grad_norm": grad_norm,
               "adv_abs_mean": float(adv.abs().mean()) if len(adv) else 0.0}
        out.update({k: v / max(mbs, 1) for k, v in stats_acc.items()})
        return out

    # ------------------------------------------------------------------ loop
    async def train_step(self, step: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        rollouts, stats = await self.collect(step)
        t1 = time.perf_counter()
        if not rollouts:
            log.error("step %d: every rollout was dropped (%s)", step,
                      sorted(set(stats.abort_reasons))[:3])
            train = {"loss": float("nan")}
        else:
            train = await asyncio.to_thread(self.update, rollouts)
        t2 = time.perf_counter()
        m = {"step": step}
        m.update(rollout_metrics(rollouts, stats))
        gen = sum(r.num_generated for r in rollouts)
        m.update(train)
        m.update({
            "tokens_per_s": gen / (t1 - t0) if t1 > t0 else 0.0,
            "rollout_time_s": t1 - t0, "train_time_s": t2 - t1, "step_time_s": t2 - t0,
        })
        self._log_rollouts(step, rollouts)
        return m

    def _log_rollouts(self, step: int, rollouts: list[Rollout]) -> None:
        with open(self.out / "rollouts.jsonl", "a") as f:
            for r in rollouts:
                f.write(json.dumps({"step": step, **r.summary()}) + "\n")

    async def train(self) -> list[dict[str, Any]]:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "config.yaml").write_text(yaml.safe_dump(self.cfg.model_dump(), sort_keys=False))
        metrics_path = self.out / "metrics.jsonl"
        metrics_path.write_text("")
        (self.out / "rollouts.jsonl").write_text("")
        if self.cfg.warm_start.steps > 0:
            await self.warm_start()
        bar = None
        if self.cfg.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.cfg.steps, desc="grpo", unit="step")
        try:
            for step in range(1, self.cfg.steps + 1):
                m = await self.train_step(step)
                self.history.append(m)
                with open(metrics_path, "a") as f:
                    f.write(json.dumps(_jsonable(m)) + "\n")
                if bar is not None:
                    bar.set_postfix(reward=f"{m['reward_mean']:.3f}", trunc=f"{m['truncated_frac']:.2f}",
                                    tools=f"{m['tool_calls_mean']:.1f}", s=f"{m['step_time_s']:.1f}")
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        plot_metrics(self.history, self.out / "metrics.png")
        if self.cfg.save_checkpoint:
            self.save_checkpoint(self.out / "checkpoint")
        return self.history

    def save_checkpoint(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        torch.save(self.optimizer.state_dict(), path / "optimizer.pt")


def _jsonable(m: dict[str, Any]) -> dict[str, Any]:
    # JSON has no NaN: write null so every line parses with strict readers.
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in m.items()}


def plot_metrics(history: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in history]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    mean = [m["reward_mean"] for m in history]
    std = [m["reward_std"] for m in history]
    ax1.plot(steps, mean, label="reward mean")
    ax1.fill_between(steps, [a - b for a, b in zip(mean, std)], [a + b for a, b in zip(mean, std)],
                     alpha=0.2, label="± std")
    ax1.set_ylabel("reward")
    ax1.legend(loc="best")
    ax2.plot(steps, [m["len_mean"] for m in history], label="rollout length (tokens)")
    ax2.plot(steps, [m["gen_tokens_mean"] for m in history], label="generated tokens")
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("tokens")
    ax2.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------- assembly
def make_backend(cfg: TrainConfig, model, tok: TokenizerInfo) -> GenerationBackend:
    vocab = model.get_input_embeddings().weight.shape[0]
    if cfg.backend == "transformers":
        from trainer.backends.hf import TransformersBackend

        return TransformersBackend(model, seed=cfg.seed, pad_token_id=min(tok.pad_id, vocab - 1))
    from trainer.backends.vllm_backend import VllmBackend

    return VllmBackend.from_training_model(model, cfg, seed=cfg.seed)


async def connect_env(cfg: TrainConfig, tok: TokenizerInfo) -> tuple[GrpcEnvClient, Any, list[int]]:
    """Connect, check the environment exists, register the tokenizer, verify the fingerprint."""
    from tito.fingerprint import RENDERER_VERSION, compute_fingerprint

    client = GrpcEnvClient(cfg.env.address, rpc_timeout_s=cfg.env.rpc_timeout_s,
                           retries=cfg.env.rpc_retries)
    try:
        await client.wait_ready(cfg.env.ready_timeout_s)
        names = [e.name for e in await client.list_environments()]
        if cfg.env.environment not in names:
            raise EnvError("ListEnvironments",
                           f"environment {cfg.env.environment!r} not offered; the server has {names}")
        kwargs = cfg.tokenizer.chat_template_kwargs
        reg = await client.register_tokenizer(tok.files, kwargs)
        local = compute_fingerprint(tok.files, kwargs, RENDERER_VERSION)
        if reg.fingerprint != local:
            raise EnvError("RegisterTokenizer", (
                f"fingerprint mismatch: server {reg.fingerprint[:16]}… (renderer "
                f"{reg.renderer_version!r}) vs local {local[:16]}… (renderer {RENDERER_VERSION!r}); "
                "the server would render with other ids than this trainer uses"))
        if not reg.stop_token_ids:
            raise EnvError("RegisterTokenizer", "server returned no stop_token_ids")
    except BaseException:
        await client.close()
        raise
    log.info("registered tokenizer %s (family %s, stop ids %s)", reg.fingerprint[:12],
             reg.template_family, reg.stop_token_ids)
    return client, client.bind(reg.fingerprint), reg.stop_token_ids


async def run_training(cfg: TrainConfig) -> list[dict[str, Any]]:
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.model.device)
    tok = TokenizerInfo.load(cfg)
    vocab = cfg.model.vocab_size or tok.vocab_size
    model = load_model(cfg.model.path, vocab_size=vocab, seed=cfg.seed, device=str(device),
                       dtype=cfg.model.dtype)
    task = make_task(cfg.task.name, cfg.task.params, seed=cfg.seed, vocab_size=vocab)
    if task.uses_env and vocab < tok.vocab_size:
        raise ValueError(f"model.vocab_size={vocab} is smaller than the tokenizer ({tok.vocab_size}): "
                         "the env would render ids the model cannot embed")
    # Pads are never attended to or trained on, but must still be valid embedding rows.
    pad_id = tok.pad_id if tok.pad_id < vocab else 0
    client = env = None
    stop_ids = tok.eos_ids
    if task.uses_env:
        client, env, stop_ids = await connect_env(cfg, tok)
    try:
        backend = make_backend(cfg, model, tok)
        trainer = Trainer(cfg, model=model, backend=backend, task=task, env=env,
                          stop_token_ids=stop_ids, pad_id=pad_id, decode=tok.decode,
                          device=device, encode=tok.encode_teacher_text)
        return await trainer.train()
    finally:
        if client is not None:
            await client.close()
