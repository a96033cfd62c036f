"""glibc's malloc tuned for a training process on the CPU: freed tensor memory stays in the process.

By default glibc serves a large allocation with a fresh mmap (above its mmap threshold, 128 KiB rising to at most
32 MiB) and gives a freed heap top back to the kernel (above its trim threshold). A sampling step over a 151k
vocabulary allocates and frees ~10 MB tensors several times per token, and the kernel then faults in and zeroes
every page again: the demo's trainer spent ~40 % of its CPU time in the kernel. Raised thresholds keep that memory
in the heap for the next step (16 rows x 192 tokens of the demo's model: 7.9 -> 4.9 s, kernel time 5.7 -> 0.9 s).
The cost is RSS held near its peak, which a training step reaches anyway, and more: memory freed in the heap is
reused only by allocations that fit the holes it left. A 0.5B model on 24 GB went from 16.6 GB in its warm start
to 23.6 GB in GRPO's second step (killed), its warm start's optimizer state never given back. `malloc:
return_freed` (the config) is for a model that fills the machine: every allocation of 1 MiB or more is its own
mmap, unmapped when freed.

Set by `python -m trainer` at start (`TrainConfig.malloc`); left alone where the user set MALLOC_MMAP_THRESHOLD_ or
MALLOC_TRIM_THRESHOLD_ (glibc's own variables), and off glibc.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
INT_MAX = (1 << 31) - 1


def keep_freed_memory(mmap_threshold: int = 1 << 30) -> bool:
    """Serve allocations below `mmap_threshold` from the heap and never trim it; True when glibc took both."""
    return _set(mmap_threshold, INT_MAX)


def return_freed_memory(mmap_threshold: int = 1 << 20) -> bool:
    """Serve allocations of `mmap_threshold` or more by mmap, a fixed threshold (glibc's own rises with each freed
    mapping, up to 32 MiB, and then serves them from the heap); True when glibc took it."""
    return _set(mmap_threshold, None)


def _set(mmap_threshold: int, trim_threshold: int | None) -> bool:
    if sys.platform != "linux" or any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    ok = mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 and (
        trim_threshold is None or mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1)
    log.debug("malloc thresholds %s", "set" if ok else "left as they were (mallopt refused)")
    return ok
