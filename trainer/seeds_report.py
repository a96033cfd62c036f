"""Several runs of one config with different seeds, side by side: the mean GRPO reward of the first and the
last `window` steps of each run, and one plot of every run's reward curve with their mean.

    python -m trainer.seeds_report runs/demo_seed0 runs/demo_seed1 runs/demo_seed2 --plot runs/demo_seeds.png

(`scripts/demo_seeds.sh` runs the demo for seeds 0 1 2 and then this.)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from trainer.report import headless_pyplot


@dataclass(frozen=True)
class RunCurve:
    name: str
    rewards: list[float]  # mean reward per GRPO step, in step order
    wall_s: float | None

    def first(self, window: int) -> float:
        return sum(self.rewards[:window]) / len(self.rewards[:window])

    def last(self, window: int) -> float:
        return sum(self.rewards[-window:]) / len(self.rewards[-window:])


def read_run(run_dir: Path) -> RunCurve:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise SystemExit(f"{metrics} does not exist: is {run_dir} the --output-dir of a finished run?")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "reward_mean" in r]
    if not rows:
        raise SystemExit(f"{metrics} holds no GRPO step yet")
    # A step whose rollouts all failed has no reward; it counts as 0, as the run scored nothing.
    rewards = [r["reward_mean"] if r["reward_mean"] is not None else 0.0 for r in sorted(rows, key=lambda r: r["step"])]
    wall = run_dir / "wall_s"
    return RunCurve(run_dir.name, rewards, float(wall.read_text()) if wall.is_file() else None)


def table(runs: list[RunCurve], window: int) -> str:
    lines = [f"{'run':<16} {'first ' + str(window):>8} {'last ' + str(window):>8} {'rise':>7} {'steps':>5} {'wall s':>7}"]
    for r in runs:
        wall = f"{r.wall_s:7.0f}" if r.wall_s is not None else f"{'-':>7}"
        lines.append(f"{r.name:<16} {r.first(window):8.3f} {r.last(window):8.3f} {r.last(window) - r.first(window):+7.3f} "
                     f"{len(r.rewards):5d} {wall}")
    if len(runs) > 1:
        first = sum(r.first(window) for r in runs) / len(runs)
        last = sum(r.last(window) for r in runs) / len(runs)
        lines.append(f"{'mean':<16} {first:8.3f} {last:8.3f} {last - first:+7.3f}")
    return "\n".join(lines)


def plot(runs: list[RunCurve], path: Path, title: str) -> None:
    plt = headless_pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for r in runs:
        ax.plot(range(1, len(r.rewards) + 1), r.rewards, alpha=0.45, linewidth=1, label=r.name)
    steps = min(len(r.rewards) for r in runs)
    mean = [sum(r.rewards[i] for r in runs) / len(runs) for i in range(steps)]
    ax.plot(range(1, steps + 1), mean, color="black", linewidth=2, label=f"mean of {len(runs)}")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward (env's exact-answer check)")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.seeds_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run output directories (each holds metrics.jsonl)")
    ap.add_argument("--window", type=int, default=5, help="steps averaged at each end (default 5)")
    ap.add_argument("--plot", type=Path, help="write the reward curves of all runs to this PNG")
    ap.add_argument("--title", default="GRPO reward per step", help="the plot's title")
    args = ap.parse_args(argv)
    if args.window < 1:
        ap.error("--window must be at least 1")
    runs = [read_run(d) for d in args.runs]
    print(table(runs, args.window))
    if args.plot:
        plot(runs, args.plot, args.title)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
