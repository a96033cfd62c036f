"""What a run writes: its output folder, JSONL lines, the metrics of a step (over every rank's
rollouts), plots and the progress bar."""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tito.rollout.state import Rollout, Status, TruncationCause
from trainer.config import TrainConfig
from trainer.rollout import BatchStats


def start_outputs(cfg: TrainConfig, main: bool = True) -> Path:
    """The output folder with the run's config.yaml and empty metrics.jsonl and rollouts.jsonl
    (written by rank 0; a resumed run keeps its files, see `rewind_outputs`)."""
    out = Path(cfg.output_dir)
    if main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
        if not cfg.resume_from:
            (out / "metrics.jsonl").write_text("")
            (out / "rollouts.jsonl").write_text("")
    return out


def rewind_outputs(out: Path, history: list[dict[str, Any]], step: int) -> None:
    """A resumed run continues its files from the checkpoint's step: metrics.jsonl is the
    checkpoint's history, rollouts.jsonl loses the lines of steps after it (a killed run may have
    written past its last checkpoint)."""
    (out / "metrics.jsonl").write_text("")
    append_jsonl(out / "metrics.jsonl", history)
    path = out / "rollouts.jsonl"
    kept = [line for line in path.read_text().splitlines() if json.loads(line).get("step", 0) <= step] \
        if path.exists() else []
    path.write_text("".join(line + "\n" for line in kept))


def append_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with open(path, "a") as f:
        for row in rows:
            # JSON has no NaN: write null so every line parses with strict readers.
            f.write(json.dumps({k: None if isinstance(v, float) and not math.isfinite(v) else v
                                for k, v in row.items()}) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


# A turn "attempts" a call when it writes something call-shaped: a <tool_call> tag, a ```json fence or bare
# {"name": ...} JSON. An attempt the parser took as no call is a refused one (the format the model must learn).
CALL_SHAPED = re.compile(r"<tool_call>|```json|\{\s*\"name\"\s*:", re.IGNORECASE)


def turn_texts(r: Rollout, decode) -> list[str]:
    """The text of each assistant turn (its generated ids only), for reports; never re-encoded."""
    texts, end = [], r.prompt_len
    for t in r.turns:
        texts.append(decode(r.ids[end:end + t.generated]))
        end += t.generated + t.suffix_len
    return texts


def call_attempts(r: Rollout, decode) -> tuple[int, int]:
    """(turns that wrote something call-shaped, those of them the parser took no call from)."""
    shaped = [bool(CALL_SHAPED.search(text)) for text in turn_texts(r, decode)]
    return sum(shaped), sum(s and not t.tool_calls for s, t in zip(shaped, r.turns))


def rollout_record(r: Rollout, rank: int, decode=None) -> dict[str, Any]:
    """A rollout's line in rollouts.jsonl: its summary, the rank that ran it, and a digest of its
    ids (equal digests: the same tokens, e.g. across a resumed and an uninterrupted run). With `decode`, also
    its call-shaped turns and the refused ones (`call_attempts`)."""
    digest = hashlib.sha1(json.dumps([r.ids, r.mask]).encode()).hexdigest()[:16]
    record = {"rank": rank, **r.summary(), "ids_sha1": digest}
    if decode is not None:
        record["call_attempts"], record["refused_attempts"] = call_attempts(r, decode)
    return record


@dataclass
class StepPart:
    """One rank's share of a step, gathered on rank 0 for the metrics line."""

    rollouts: list[dict[str, Any]]  # rollout_record() of each kept rollout
    stats: BatchStats
    loss: float = 0.0  # this rank's part of the whole batch's loss (the parts add up)
    micro_batches: int = 0
    loss_stats: dict[str, float] = field(default_factory=dict)  # summed over micro-batches
    adv_abs_sum: float = 0.0


def step_metrics(step: int, parts: list[StepPart], grad_norm: float | None, rollout_time_s: float,
                 train_time_s: float) -> dict[str, Any]:
    """The metrics line of a step, over every rank's rollouts."""
    rows = [r for p in parts for r in p.rollouts]
    stats = BatchStats(attempts=sum(p.stats.attempts for p in parts),
                       aborted_attempts=sum(p.stats.aborted_attempts for p in parts),
                       dropped=sum(p.stats.dropped for p in parts))
    m: dict[str, Any] = {"step": step, **rollout_metrics(rows, stats), "loss": float("nan")}
    micro = sum(p.micro_batches for p in parts)
    if grad_norm is not None:
        m.update(loss=sum(p.loss for p in parts), grad_norm=grad_norm,
                 adv_abs_mean=sum(p.adv_abs_sum for p in parts) / max(len(rows), 1))
        keys = {k for p in parts for k in p.loss_stats}
        m.update({k: sum(p.loss_stats.get(k, 0.0) for p in parts) / max(micro, 1) for k in sorted(keys)})
    m.update(tokens_per_s=sum(r["generated"] for r in rows) / rollout_time_s if rollout_time_s > 0 else 0.0,
             rollout_time_s=rollout_time_s, train_time_s=train_time_s,
             step_time_s=rollout_time_s + train_time_s)
    if len(parts) > 1:
        m["ranks"] = len(parts)
    return m


def rollout_metrics(rollouts: list[dict[str, Any]], stats: BatchStats) -> dict[str, Any]:
    """Metrics over rollout records (`rollout_record`)."""
    n = len(rollouts)
    rewards = [r["reward"] for r in rollouts if r["reward"] is not None]

    def frac(pred) -> float:
        return sum(1 for r in rollouts if pred(r)) / n if n else float("nan")

    def mean(xs) -> float:
        xs = list(xs)
        return sum(xs) / len(xs) if xs else float("nan")

    return {
        "rollouts": n,
        "reward_mean": mean(rewards),
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "completed_frac": frac(lambda r: r["status"] == Status.COMPLETED.value),
        "truncated_frac": frac(lambda r: r["status"] == Status.TRUNCATED.value),
        "truncated_length_frac": frac(lambda r: r["truncation"] == TruncationCause.LENGTH.value),
        "truncated_tool_overflow_frac": frac(lambda r: r["truncation"] == TruncationCause.TOOL_OVERFLOW.value),
        "truncated_max_turns_frac": frac(lambda r: r["truncation"] == TruncationCause.MAX_TURNS.value),
        # Share of rollout attempts that aborted (env failure, missing logprobs, ...).
        "aborted_frac": stats.aborted_attempts / stats.attempts if stats.attempts else 0.0,
        "dropped": stats.dropped,
        "tool_calls_mean": mean(r["tool_calls"] for r in rollouts),
        # Full marks (a scorer may give partial credit), and rollouts that called a tool at all.
        "solved_frac": frac(lambda r: r["reward"] is not None and r["reward"] >= 1.0),
        "tool_call_frac": frac(lambda r: r["tool_calls"] > 0),
        "turns_mean": mean(r["turns"] for r in rollouts),
        "gen_tokens_mean": mean(r["generated"] for r in rollouts),
        "len_mean": mean(r["len"] for r in rollouts),
        **_refused(rollouts),
    }


def _refused(rollouts: list[dict[str, Any]]) -> dict[str, float]:
    """The share of call-shaped turns the parser refused (where the records carry `call_attempts`)."""
    if not rollouts or "call_attempts" not in rollouts[0]:
        return {}
    attempts = sum(r["call_attempts"] for r in rollouts)
    return {"call_attempts": attempts,
            "refused_attempt_frac": sum(r["refused_attempts"] for r in rollouts) / attempts if attempts else 0.0}


class ProgressBar:
    """A tqdm bar when enabled, else nothing; `advance(**postfix)` after each step."""

    def __init__(self, enabled: bool, total: int, desc: str, initial: int = 0) -> None:
        self._bar = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="step", initial=initial)

    def advance(self, **postfix: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix(**postfix)
            self._bar.update(1)

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()


def headless_pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display), imported when a plot is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_metrics(history: list[dict[str, Any]], path: Path) -> None:
    """Reward mean ± std and rollout lengths over the GRPO steps."""
    plt = headless_pyplot()
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


def plot_warm_start(history: list[dict[str, Any]], path: Path) -> None:
    """The SFT loss over the warm-start steps."""
    plt = headless_pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([m["step"] for m in history], [m["loss"] for m in history])
    ax.set_yscale("log")
    ax.set_xlabel("warm-start step")
    ax.set_ylabel("SFT loss (nats/token)")
    ax.set_title("warm start on demonstrations")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
