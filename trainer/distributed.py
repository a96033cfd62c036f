"""Data parallelism over processes started by torchrun or `accelerate launch`.

Each rank generates its share of the prompt groups (a group never spans ranks, so its advantages
are local), computes its micro-batches' gradients with the normalisers of the *whole* batch, and
the gradients are summed across ranks before the optimizer step: every rank then takes the same
step and the weights stay identical. Rank 0 writes the outputs.

The sum is one bucketed all-reduce after the micro-batches rather than DDP's backward hooks, on
purpose: DDP needs every rank to run the same number of backward passes, and here that number
varies (dropped rollouts, micro-batches with nothing to train on, uneven shards), which would hang
DDP. Summing after accumulation is what DDP's `no_sync()` plus a last synced backward computes.

That is `distributed.strategy: replicate`. With `fsdp` (trainer/fsdp.py) the weights are sharded
and every forward and backward pass is collective, so there the ranks first agree on the number
of micro-batches (`max`) and pad with ones that train on nothing (train.py).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as torch_dist

log = logging.getLogger(__name__)

T = TypeVar("T")
_BUCKET_BYTES = 64 << 20  # all-reduce gradients in buckets of this size


@dataclass(frozen=True)
class Dist:
    """This process's place in the job; world 1 (the default) is a plain single-process run."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    joined: bool = False  # this process joined a process group (also a world of 1 under fsdp)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def shard(self, items: list[T]) -> list[T]:
        """This rank's share: items rank, rank + world, ... (round robin)."""
        return items[self.rank :: self.world]

    def barrier(self) -> None:
        if self.enabled:
            torch_dist.barrier()

    def sum(self, *values: float) -> list[float]:
        """Each value summed over the ranks (float64, so counts stay exact)."""
        if not self.enabled:
            return [float(v) for v in values]
        t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
        torch_dist.all_reduce(t)
        return t.tolist()

    def max(self, value: int) -> int:
        """The largest `value` over the ranks."""
        if not self.enabled:
            return int(value)
        t = torch.tensor([value], dtype=torch.int64, device=_comm_device())
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
        return int(t.item())

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj` on rank 0 (in rank order), None elsewhere."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world if self.is_main else None
        torch_dist.gather_object(obj, out, dst=0)
        return out

    def all_reduce_grads(self, model: torch.nn.Module) -> None:
        """Sum the gradients over the ranks. A rank that trained on nothing contributes zeros."""
        if not self.enabled:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        bucket: list[torch.Tensor] = []
        size = 0
        for g in (p.grad for p in params):
            if bucket and (g.dtype != bucket[0].dtype or size + g.numel() * g.element_size() > _BUCKET_BYTES):
                _all_reduce_flat(bucket)
                bucket, size = [], 0
            bucket.append(g)
            size += g.numel() * g.element_size()
        if bucket:
            _all_reduce_flat(bucket)

    def broadcast_model(self, model: torch.nn.Module) -> None:
        """Rank 0's parameters and buffers on every rank (as DDP does at construction)."""
        if not self.enabled:
            return
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                torch_dist.broadcast(t.data, src=0)

    def check_same_weights(self, model: torch.nn.Module) -> None:
        """Raise if the ranks' parameters differ (one small all-reduce of a checksum)."""
        if not self.enabled:
            return
        with torch.no_grad():
            s = torch.stack([p.detach().double().pow(2).sum() for p in model.parameters()]).sum()
        t = torch.stack([s, -s]).to(_comm_device())
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
        if float(t[0]) != -float(t[1]):
            raise RuntimeError(f"rank {self.rank}: the ranks' weights diverged (checksum max {float(t[0])!r}, "
                               f"min {-float(t[1])!r})")


def _comm_device() -> torch.device:
    # NCCL moves CUDA tensors only; gloo CPU ones ("cuda:nccl,cpu:gloo" both: use the GPU).
    return torch.device("cuda", torch.cuda.current_device()) if "nccl" in str(torch_dist.get_backend()) \
        else torch.device("cpu")


def _all_reduce_flat(tensors: list[torch.Tensor]) -> None:
    flat = torch.cat([t.reshape(-1) for t in tensors])
    torch_dist.all_reduce(flat)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def launched_world() -> tuple[int, int, int]:
    """(rank, world, local_rank) from the variables torchrun and `accelerate launch` set."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    return rank, world, local_rank


def init(device: str, timeout_s: float = 1800.0, *, fsdp: bool = False, cpu_offload: bool = False) -> Dist:
    """Join the process group when launched with several processes (or, for fsdp, by a launcher at
    all: FSDP needs a group even of one): NCCL when training on CUDA, gloo otherwise, both with
    cpu_offload (the offloaded gradients' norm is reduced on the CPU). Each rank trains on
    cuda:LOCAL_RANK."""
    from trainer.config import ConfigError

    rank, world, local_rank = launched_world()
    launched = "MASTER_ADDR" in os.environ and "WORLD_SIZE" in os.environ
    if fsdp and not launched and not torch_dist.is_initialized():
        raise ConfigError("distributed.strategy: fsdp shards the model over the processes that torchrun or accelerate "
                          "launch starts, and this process was not started by one (no WORLD_SIZE/MASTER_ADDR): run "
                          "torchrun --nproc-per-node N -m trainer ... (N=1 is fine: one GPU, e.g. with "
                          "distributed.cpu_offload), or set distributed.strategy: replicate")
    if world <= 1 and not fsdp:
        return Dist()
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(local_rank)
    if not torch_dist.is_initialized():
        backend = ("cuda:nccl,cpu:gloo" if cpu_offload else "nccl") if cuda else "gloo"
        torch_dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    log.info("rank %d of %d (local %d, %s)", rank, world, local_rank, torch_dist.get_backend())
    return Dist(rank=rank, world=world, local_rank=local_rank, joined=True)


def shutdown(d: Dist) -> None:
    if d.joined and torch_dist.is_initialized():
        torch_dist.destroy_process_group()
