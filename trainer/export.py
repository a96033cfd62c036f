"""`python -m trainer.export CHECKPOINT OUT [--dtype bfloat16]`: a checkpoint as a `save_pretrained`
folder (what `model.path`, vLLM and transformers load).

A replicate checkpoint is one already (its folder is copied as it is); an fsdp checkpoint holds the
policy as shards in `sharded/` (torch.distributed.checkpoint), which this reads into one whole
model in this process (no process group, no GPU: it needs the model's size in host memory) and
writes with `save_pretrained`. The optimizer and the KL reference stay behind.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from trainer.checkpoint import SHARDED, STATE, resolve


def export(source: str | Path, out: str | Path, dtype: str | None = None) -> Path:
    """Write the policy of the checkpoint at `source` (a checkpoint or a run folder) to `out`."""
    path, out = resolve(source), Path(out)
    state = json.loads((path / STATE).read_text())
    if state.get("strategy", "replicate") != "fsdp":
        shutil.copytree(path, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("rng", "optimizer.pt", "ref"))
        return out
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype) if dtype else None)
    # Plain tensors as the target: DCP assembles each whole tensor from the shards that hold it.
    weights = {k: v for k, v in model.state_dict().items()}
    dcp.load({"model": weights}, checkpoint_id=str(path / SHARDED), no_dist=True)
    model.load_state_dict(weights)
    model.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.export", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a checkpoint folder, or a run folder (its newest checkpoint)")
    p.add_argument("out", help="the folder to write")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="cast the weights (default: as saved)")
    a = p.parse_args(argv)
    try:
        out = export(a.checkpoint, a.out, a.dtype)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
