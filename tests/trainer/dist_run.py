"""Run under torchrun by test_distributed.py: the trainer as `python -m trainer` runs it (same
config loading, `open_run`, `train`), then this rank's final weights to OUT/rank<R>.pt, so the test
can compare the ranks' weights independently of the trainer's own checks.

    torchrun --nproc-per-node 2 -m tests.trainer.dist_run OUT [python -m trainer arguments]
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import torch

from trainer.config import load_config
from trainer.setup import open_run
from trainer.train import train


async def main(out: Path, argv: list[str]) -> None:
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    config = argv[argv.index("--config") + 1] if "--config" in argv else None
    cfg = load_config(config, sets, {"output_dir": str(out)})
    async with open_run(cfg) as run:
        await train(run, cfg)
        state = {k: v.detach().cpu().clone() for k, v in run.model.state_dict().items()}
        torch.save(state, out / f"rank{run.dist.rank}.pt")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2:]))
