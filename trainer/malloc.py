"""glibc's malloc tuned for a training process on the CPU: freed tensor memory stays in the process.

By default glibc serves a large allocation with a fresh mmap (above its mmap threshold, 128 KiB rising to at most
32 MiB) and gives a freed heap top back to the kernel (above its trim threshold). A sampling step over a 151k
vocabulary allocates and frees ~10 MB tensors several times per token, and the kernel then faults in and zeroes
every page again: the demo's trainer spent ~40 % of its CPU time in the kernel. Raised thresholds keep that memory
in the heap for the next step (16 rows x 192 tokens of the demo's model: 7.9 -> 4.9 s, kernel time 5.7 -> 0.9 s).
The cost is RSS held near its peak, which a training step reaches anyway.

Set by `python -m trainer` at start; left alone where the user set MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_
(glibc's own variables), and off glibc.
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
    if sys.platform != "linux" or any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    ok = mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 and mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1
    log.debug("malloc thresholds %s", "raised" if ok else "left as they were (mallopt refused)")
    return ok
