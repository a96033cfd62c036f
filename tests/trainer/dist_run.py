"""Run under torchrun by test_distributed.py and test_fsdp.py: the trainer as `python -m trainer`
runs it (same config loading, `open_run`, `train`), then this rank's final weights (whole, also
under fsdp) to OUT/rank<R>.pt, so the test can compare the ranks' weights independently of the
trainer's own checks.

    torchrun --nproc-per-node 2 -m tests.trainer.dist_run OUT [--engine-check] [python -m trainer arguments]

--engine-check (the vLLM backend): after training, the rank's engine samples a few seeded turns and
OUT/engine<R>.json gets the largest |engine logprob - recompute| under the trained weights and
under the initial ones (the tiny model of the config's seed): an engine that kept the old weights
would match the second, not the first.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from tito.rollout.generation import GenRequest
from tito.rollout.state import Rollout
from trainer.config import load_config
from trainer.model import build_tiny_qwen3, collate, target_logprobs
from trainer.setup import open_run
from trainer.train import train


async def engine_check(run, cfg, weights: dict[str, torch.Tensor]) -> dict[str, float]:
    requests = [GenRequest(prompt_ids=[151644, 872, 198, 100 + i], max_new=8, stop_token_ids=(151645,), seed=i)
                for i in range(4)]
    results = await run.backend.generate(requests)
    rollouts = []
    for req, res in zip(requests, results):
        r = Rollout(budget=64)
        r.start(req.prompt_ids)
        r.append_generated(res.ids, res.logprobs, res.finish_reason, req.max_new)
        rollouts.append(r)
    batch = collate(rollouts, torch.zeros(len(rollouts)), pad_id=0, device="cpu")
    sel = batch.mask.bool()
    errors = {}
    initial = build_tiny_qwen3(vocab_size=cfg.model.vocab_size or 151669, seed=cfg.seed, head_dim=cfg.model.head_dim)
    trained = build_tiny_qwen3(vocab_size=cfg.model.vocab_size or 151669, seed=cfg.seed, head_dim=cfg.model.head_dim)
    trained.load_state_dict(weights, strict=False)
    for name, model in (("trained", trained), ("initial", initial)):
        with torch.no_grad():
            lp = target_logprobs(model.eval(), batch.input_ids, batch.mask, cfg.temperature)
        errors[name] = (lp[sel] - batch.old_logp[sel]).abs().max().item()
    return errors


async def main(out: Path, argv: list[str]) -> None:
    check = "--engine-check" in argv
    argv = [a for a in argv if a != "--engine-check"]
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    config = argv[argv.index("--config") + 1] if "--config" in argv else None
    cfg = load_config(config, sets, {"output_dir": str(out)})
    async with open_run(cfg) as run:
        await train(run, cfg)
        # The whole model on every rank (gathered from the shards under fsdp).
        state = get_model_state_dict(run.model, options=StateDictOptions(full_state_dict=True))
        weights = {k: v.detach().cpu().clone() for k, v in state.items()}
        torch.save(weights, out / f"rank{run.dist.rank}.pt")
        if check:
            errors = await engine_check(run, cfg, weights)
            (out / f"engine{run.dist.rank}.json").write_text(json.dumps(errors))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2:]))
