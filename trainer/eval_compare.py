"""Held-out accuracy of several evaluations of the same problems side by side, and the change between them with a
paired bootstrap interval.

    python -m trainer.eval_compare runs/real/eval-base runs/real/eval-warmstart runs/real/eval-final \
        [--labels base,warm-start,GRPO] [--run runs/real --plot runs/real/curves.png]

Each folder is an output of `python -m trainer.evaluate` (rollouts.jsonl, summary.json). The problems are matched
by index, so each difference is paired: one bootstrap resample draws the same problems for both evaluations, which
gives a tighter interval of the difference than two independent intervals would. A problem that an evaluation
dropped counts as wrong there (it got no answer). Accuracy counts full marks only, as trainer.evaluate does.
With --run and --plot, the training run's curves over its GRPO steps (metrics.jsonl): reward, solved share,
tool-call share, refused call-shaped turns, step time.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any


def load(folder: str | Path) -> tuple[dict[str, Any], dict[int, float]]:
    """(summary.json, {problem index: 1.0 if fully right else 0.0}) of one evaluation folder."""
    folder = Path(folder)
    try:
        summary = json.loads((folder / "summary.json").read_text())
        lines = (folder / "rollouts.jsonl").read_text().splitlines()
    except (OSError, ValueError) as e:
        raise SystemExit(f"{folder} is not a trainer.evaluate output (summary.json, rollouts.jsonl): {e}") from e
    right = {}
    for line in lines:
        r = json.loads(line)
        right[int(r["index"])] = 1.0 if r["reward"] >= 1.0 else 0.0
    return summary, right


def paired_difference(a: dict[int, float], b: dict[int, float], *, samples: int = 4000, seed: int = 0
                      ) -> tuple[float, float, float, int]:
    """(mean of b - a, 95% percentile bootstrap interval low, high, problems) over the problems either has."""
    keys = sorted(set(a) | set(b))
    diffs = [b.get(k, 0.0) - a.get(k, 0.0) for k in keys]
    if not diffs:
        return float("nan"), float("nan"), float("nan"), 0
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(rng.choices(diffs, k=n)) / n for _ in range(samples))
    return sum(diffs) / n, means[int(0.025 * samples)], means[min(samples - 1, int(0.975 * samples))], n


def table(folders: list[str], labels: list[str]) -> str:
    loaded = [load(f) for f in folders]
    rows = ["| evaluation | problems | accuracy [95% CI] | change from the first [paired 95% CI] | tool-call rate "
            "| refused attempts | mean turns | mean tokens |", "|---|---|---|---|---|---|---|---|"]
    first = loaded[0][1]
    for label, (s, right) in zip(labels, loaded):
        low, high = s["accuracy_ci95"]
        if right is first:
            change = "—"
        else:
            d, dl, dh, _ = paired_difference(first, right)
            change = f"{100 * d:+.1f} pts [{100 * dl:+.1f}, {100 * dh:+.1f}]"
        rows.append(f"| {label} | {s['scored']} | {s['accuracy']:.3f} [{low:.3f}, {high:.3f}] | {change} | "
                    f"{s['tool_call_rate']:.2f} | {s['refused_attempts']}/{s['tool_call_attempts']} | "
                    f"{s['mean_turns']:.2f} | {s['mean_generated_tokens']:.0f} |")
    for i in range(1, len(loaded) - 1):  # each later step against the one before it
        d, dl, dh, n = paired_difference(loaded[i][1], loaded[-1][1])
        rows.append(f"\n{labels[-1]} against {labels[i]}: {100 * d:+.1f} points [{100 * dl:+.1f}, {100 * dh:+.1f}] "
                    f"over {n} problems (paired bootstrap)")
    return "\n".join(rows)


CURVES = (("reward_mean", "mean reward"), ("solved_frac", "solved (full marks)"),
          ("tool_call_frac", "rollouts that called a tool"), ("refused_attempt_frac", "call-shaped turns refused"),
          ("step_time_s", "step time (s)"))


def plot_run(run_dir: str | Path, path: str | Path) -> None:
    """The training run's curves over its GRPO steps (metrics.jsonl), one panel each."""
    from trainer.report import headless_pyplot

    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "reward_mean" in r]
    if not rows:
        raise SystemExit(f"{run_dir}/metrics.jsonl has no GRPO step yet")
    plt = headless_pyplot()
    fig, axes = plt.subplots(len(CURVES), 1, figsize=(7, 2.0 * len(CURVES)), sharex=True)
    steps = [r["step"] for r in rows]
    for ax, (key, label) in zip(axes, CURVES):
        ax.plot(steps, [r.get(key, float("nan")) for r in rows], marker="o")
        ax.set_ylabel(label, fontsize=8)
        if key != "step_time_s":
            ax.set_ylim(-0.05, 1.05)
    axes[-1].set_xlabel("GRPO step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", help="trainer.evaluate output folders, the baseline first")
    ap.add_argument("--labels", default=None, help="comma-separated names of the evaluations (default: the folders)")
    ap.add_argument("--run", default=None, help="the training run's output folder (its metrics.jsonl)")
    ap.add_argument("--plot", default=None, help="with --run: where to draw its curves (a .png)")
    args = ap.parse_args(argv)
    if len(args.folders) < 2:
        ap.error("give at least two evaluations: the baseline and one to compare with it")
    labels = args.labels.split(",") if args.labels else [Path(f).name for f in args.folders]
    if len(labels) != len(args.folders):
        ap.error(f"{len(labels)} labels for {len(args.folders)} folders")
    print(table(args.folders, labels))
    if args.run and args.plot:
        plot_run(args.run, args.plot)
        print(f"\ncurves of {args.run}: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
