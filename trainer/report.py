"""What a run writes: its output folder, JSONL lines, the rollout metrics of a step, plots and the
progress bar."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from trainer.config import TrainConfig
from trainer.rollout import BatchStats
from trainer.state import Rollout, Status, TruncationCause


def start_outputs(cfg: TrainConfig) -> Path:
    """The output folder with the run's config.yaml and empty metrics.jsonl and rollouts.jsonl."""
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
    (out / "metrics.jsonl").write_text("")
    (out / "rollouts.jsonl").write_text("")
    return out


def append_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with open(path, "a") as f:
        for row in rows:
            # JSON has no NaN: write null so every line parses with strict readers.
            f.write(json.dumps({k: None if isinstance(v, float) and not math.isfinite(v) else v
                                for k, v in row.items()}) + "\n")


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


class ProgressBar:
    """A tqdm bar when enabled, else nothing; `advance(**postfix)` after each step."""

    def __init__(self, enabled: bool, total: int, desc: str) -> None:
        self._bar = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="step")

    def advance(self, **postfix: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix(**postfix)
            self._bar.update(1)

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_metrics(history: list[dict[str, Any]], path: Path) -> None:
    """Reward mean ± std and rollout lengths over the GRPO steps."""
    plt = _pyplot()
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
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([m["step"] for m in history], [m["loss"] for m in history])
    ax.set_yscale("log")
    ax.set_xlabel("warm-start step")
    ax.set_ylabel("SFT loss (nats/token)")
    ax.set_title("warm start on demonstrations")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
