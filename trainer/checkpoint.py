"""Checkpoints: everything needed to continue a run as if it had not stopped.

`OUT/checkpoints/step-NNNNNN/` holds the policy as `save_pretrained` writes it (so the folder also
works as `model.path`), `optimizer.pt`, `ref/` (the frozen KL reference, when `loss.beta > 0`),
`config.yaml`, `trainer_state.json` (the step and the metrics so far) and `rng/rank<R>.pt` (each
rank's python, numpy, torch and CUDA generators and the backend's shared sampler). `OUT/checkpoint`
is a symlink to the newest one. A checkpoint is written under a temporary name and renamed when
complete, so a run killed while saving leaves the previous one intact.

Resuming loads the same things, points the generation backend at the restored weights, and the
loop continues at the next step; the task's prompts and the per-request sampling seeds are
functions of the step, so the resumed step is the one the uninterrupted run would have taken.

Under `distributed.strategy: fsdp` the policy, optimizer and reference are sharded, and so is
their checkpoint: `sharded/` is a `torch.distributed.checkpoint` (DCP) folder that every rank
writes its shards into (no rank gathers the model), beside the model's `config.json`. DCP reshards
on load, so a run may resume on another number of ranks. `python -m trainer.export CKPT OUT`
turns it into a `save_pretrained` folder.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from trainer import fsdp, report
from trainer.config import ConfigError, TrainConfig

if TYPE_CHECKING:
    from trainer.setup import Run

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
LATEST = "checkpoint"
STATE = "trainer_state.json"
SHARDED = "sharded"  # the DCP folder of an fsdp checkpoint


def due(step: int, cfg: TrainConfig) -> bool:
    return cfg.save_checkpoint and (step == cfg.steps or (cfg.save_steps > 0 and step % cfg.save_steps == 0))


def save(out: Path, step: int, run: Run, optimizer: torch.optim.Optimizer, ref_model, cfg: TrainConfig,
         history: list[dict[str, Any]]) -> Path:
    """Write the checkpoint of `step` (every rank calls this; rank 0 writes the shared parts)."""
    dist = run.dist
    sharded = fsdp.is_sharded(run.model)
    if not sharded:
        dist.check_same_weights(run.model)  # one rank's weights stand for all
    root = out / CHECKPOINTS
    final, tmp = root / f"step-{step:06d}", root / f".step-{step:06d}.tmp"
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "rng").mkdir(parents=True)
    dist.barrier()
    torch.save(rng_state(run.backend), tmp / "rng" / f"rank{dist.rank}.pt")
    if sharded:
        save_sharded(tmp / SHARDED, run.model, optimizer, ref_model)  # every rank its shards
    if dist.is_main:
        if sharded:
            # The architecture only (weights are in sharded/); save_pretrained would name the class.
            run.model.config.architectures = [type(run.model).__name__.removeprefix("FSDP")]
            run.model.config.save_pretrained(tmp)
        else:
            run.model.save_pretrained(tmp)
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            if ref_model is not None:
                ref_model.save_pretrained(tmp / "ref")
        (tmp / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
        # Python's json keeps NaN (the metrics use it); this file is read back only by restore().
        (tmp / STATE).write_text(json.dumps({"step": step, "world": dist.world, "history": history,
                                             "strategy": "fsdp" if sharded else "replicate",
                                             "ref": ref_model is not None}))
    dist.barrier()
    if dist.is_main:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _point_latest(out, final)
        _prune(root, keep=cfg.save_total_limit, current=final)
        log.info("checkpoint: %s", final)
    dist.barrier()
    return final


def restore(source: str | Path, run: Run, optimizer: torch.optim.Optimizer, ref_model, out: Path
            ) -> tuple[int, list[dict[str, Any]]]:
    """Load the checkpoint at `source` (a checkpoint, or a run folder: its newest) into the run,
    and rewind the output files in `out` to its step; returns (its step, the metrics so far)."""
    path = resolve(source)
    state = json.loads((path / STATE).read_text())
    saved_by, sharded = state.get("strategy", "replicate"), fsdp.is_sharded(run.model)
    if (saved_by == "fsdp") != sharded:
        raise ConfigError(f"{path} was saved by distributed.strategy {saved_by}, and this run uses "
                          f"{'fsdp' if sharded else 'replicate'}: resume with strategy {saved_by} (a fsdp checkpoint "
                          f"becomes a plain model folder with python -m trainer.export {path} OUT)")
    if sharded:
        load_sharded(path / SHARDED, run.model, optimizer, ref_model, has_ref=bool(state.get("ref")))
    else:
        load_weights(run.model, path)
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
    if ref_model is not None and not sharded:
        if (path / "ref").is_dir():
            load_weights(ref_model, path / "ref")
        else:
            log.warning("%s has no KL reference (saved with loss.beta 0): the restored policy is the reference", path)
            ref_model.load_state_dict(run.model.state_dict())
    rng = path / "rng" / f"rank{run.dist.rank}.pt"
    if rng.is_file():
        set_rng_state(torch.load(rng, weights_only=False), run.backend)  # our own file: numpy state is pickled
    else:
        log.warning("%s has no RNG state for rank %d (saved by %d ranks): sampling will not repeat exactly",
                    path, run.dist.rank, state.get("world", 1))
    run.backend.sync_weights(run.model)
    if run.dist.is_main:
        report.rewind_outputs(out, state["history"], int(state["step"]))
    log.info("resumed from %s at step %d", path, state["step"])
    return int(state["step"]), state["history"]


def save_sharded(folder: Path, model, optimizer: torch.optim.Optimizer, ref_model) -> None:
    """The sharded policy, optimizer and reference as one DCP checkpoint (every rank calls this)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    if ref_model is not None:
        state["ref"] = get_model_state_dict(ref_model)
    dcp.save(state, checkpoint_id=str(folder))


def load_sharded(folder: Path, model, optimizer: torch.optim.Optimizer, ref_model, *, has_ref: bool) -> None:
    """`save_sharded`'s checkpoint into the sharded model, optimizer and reference (in place; DCP
    reads each rank's part, whatever the number of ranks that wrote it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict, set_model_state_dict,
                                                         set_state_dict)

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    if ref_model is not None and has_ref:
        state["ref"] = get_model_state_dict(ref_model)
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if ref_model is not None:
        if not has_ref:
            log.warning("%s has no KL reference (saved with loss.beta 0): the restored policy is the reference", folder)
        set_model_state_dict(ref_model, state["ref"] if has_ref else state["model"])


def resolve(source: str | Path) -> Path:
    """A checkpoint folder from a checkpoint or a run folder."""
    p = Path(source)
    if (p / STATE).is_file():
        return p
    if (p / LATEST / STATE).is_file():
        return (p / LATEST).resolve()
    steps = sorted((p / CHECKPOINTS).glob("step-*")) if (p / CHECKPOINTS).is_dir() else []
    steps = [s for s in steps if (s / STATE).is_file()]
    if steps:
        return steps[-1]
    raise FileNotFoundError(f"no checkpoint at {p} (expected {STATE}, {LATEST}/ or {CHECKPOINTS}/step-*)")


def load_weights(model: torch.nn.Module, folder: Path) -> None:
    """Load a `save_pretrained` folder's safetensors into `model` (in place, so everything that
    holds the model keeps it). Keys absent because they are tied to a loaded one are fine."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    device = str(next(model.parameters()).device)
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(f, device=device))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = {params[k].data_ptr() for k in sd if k in params}
    untied = [k for k in missing if k not in params or params[k].data_ptr() not in loaded]
    if untied or unexpected:
        raise ValueError(f"checkpoint {folder} does not fit the model: missing {untied[:5]}, "
                         f"unexpected {list(unexpected)[:5]}")


def rng_state(backend) -> dict[str, Any]:
    """Every generator that can drive sampling in this process."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if hasattr(backend, "rng_state"):
        state["backend"] = backend.rng_state()
    return state


def set_rng_state(state: dict[str, Any], backend) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "backend" in state and hasattr(backend, "set_rng_state"):
        backend.set_rng_state(state["backend"])


def _point_latest(out: Path, target: Path) -> None:
    link, tmp = out / LATEST, out / f".{LATEST}.tmp"
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)  # a plain folder from an older layout
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target.relative_to(out))
    os.replace(tmp, link)  # atomic: the link always names a complete checkpoint


def _prune(root: Path, *, keep: int, current: Path) -> None:
    """Keep the newest `keep` up to `current`. Later ones are from a timeline this run abandoned by
    resuming from an earlier checkpoint (its metrics.jsonl rows were dropped the same way)."""
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    earlier = [p for p in steps if p.name <= current.name]
    for old in earlier[:-keep] + [p for p in steps if p.name > current.name]:
        shutil.rmtree(old, ignore_errors=True)
