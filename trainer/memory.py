"""Peak tensor memory of a block of code, on CUDA and on the CPU.

CUDA has the caching allocator's counters (`torch.cuda.max_memory_allocated`); the CPU has none
(the process's RSS mixes in the allocator's caching and every library). `PeakTensorMemory` counts
on any device: a dispatch mode that sees every tensor an op creates, adds its storage's bytes
while the storage lives and keeps the maximum. Tensors that existed before the block (weights,
optimizer state) are not counted, so on the CPU the figure is what the block allocates on top of
them: for a micro-step, the activations, gradients and temporaries. torch's own
`torch.distributed._tools.mem_tracker.MemTracker` does more, but refuses a module called twice in
one step, which the chunked LM head does.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class PeakTensorMemory(TorchDispatchMode):
    """`with PeakTensorMemory() as m: ...` then `m.peak` (bytes); `m.current` while inside."""

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._live: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not t.is_meta:
                self._track(t.untyped_storage())
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata  # one storage, however many views of it an op returns
        if key in self._live:
            return
        size = storage.nbytes()
        self._live[key] = weakref.ref(storage, lambda _ref, key=key, size=size: self._freed(key, size))
        self.current += size
        self.peak = max(self.peak, self.current)

    def _freed(self, key: int, size: int) -> None:
        if self._live.pop(key, None) is not None:
            self.current -= size


def cuda_peak_reset(device: torch.device) -> None:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)


def cuda_peak(device: torch.device) -> int:
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)
