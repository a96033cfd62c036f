"""`python -m trainer --config examples/demo.yaml [--output-dir DIR] [--env-address HOST:PORT]`

Several processes: `torchrun --nproc-per-node N -m trainer --config ...` or
`accelerate launch --num_processes N -m trainer --config ...` (data parallel; see docs/trainer.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path

from tito.client import TitoError
from trainer.config import ConfigError, TrainConfig, load_config


async def train_from_config(cfg: TrainConfig) -> list[dict]:
    # Imported here so that a config error is reported before torch loads.
    from trainer.setup import open_run
    from trainer.train import train

    async with open_run(cfg) as run:
        return await train(run, cfg)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer", description="GRPO trainer for tito.")
    p.add_argument("--config", help="YAML config file (see examples/demo.yaml)")
    p.add_argument("--output-dir", help="metrics.jsonl, metrics.png, checkpoint/ go here")
    p.add_argument("--env-address", help="env server HOST:PORT")
    p.add_argument("--steps", type=int, help="optimizer steps (in all, counting those before a resume)")
    p.add_argument("--resume", metavar="DIR", help="continue from a checkpoint, or from a run folder's latest")
    p.add_argument("--report-to", metavar="NAMES", help="trackers: tensorboard, trackio (comma-separated), "
                   "all or none")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set budget.context=512 (repeatable)")
    p.add_argument("--log-level", default="WARNING")
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(a.config, a.set, {"output_dir": a.output_dir, "env.address": a.env_address,
                                            "steps": a.steps, "resume_from": a.resume, "report_to": a.report_to})
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    from trainer.malloc import keep_freed_memory, return_freed_memory
    from trainer.warmstart import WarmStartError

    # Before the first large tensor (trainer/malloc.py says why).
    (keep_freed_memory if cfg.malloc == "keep_freed" else return_freed_memory)()
    t0 = time.perf_counter()
    try:
        history = asyncio.run(train_from_config(cfg))
    except TitoError as e:
        print(f"env server error: {e}", file=sys.stderr)
        return 1
    except WarmStartError as e:
        print(f"warm start failed: {e}", file=sys.stderr)
        return 1
    except ConfigError as e:  # found once the config meets the machine (e.g. vLLM's CPU build), before training
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except ImportError as e:  # an optional part the config asks for (vLLM, a tracker), with what to install
        print(f"missing dependency: {e}", file=sys.stderr)
        return 1
    if not history:  # ranks other than 0 report nothing; so does a resume with no steps left
        return 0
    last = history[-1]
    keys = ("step", "reward_mean", "reward_std", "truncated_frac", "aborted_frac", "tool_calls_mean")
    if cfg.warm_start.steps > 0:
        warm = Path(cfg.output_dir) / "warmstart.jsonl"
        losses = [json.loads(x)["loss"] for x in warm.read_text().splitlines()] if warm.exists() else []
        if losses:
            print(f"warm start: {len(losses)} SFT steps, loss {losses[0]:.3f} -> {losses[-1]:.4f}")
    if len(history) > 1:
        def _fmt(x):
            return "nan" if x is None or x != x else f"{x:.3f}"
        print(f"GRPO reward_mean: step 1 {_fmt(history[0].get('reward_mean'))} -> step "
              f"{last.get('step')} {_fmt(last.get('reward_mean'))}")
    print(json.dumps({k: last.get(k) for k in keys}))
    print(f"done in {time.perf_counter() - t0:.1f}s; outputs in {cfg.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
