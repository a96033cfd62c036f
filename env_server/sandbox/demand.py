"""How many warm sandboxes the pool should hold: the configured floor, raised to the recent peak of opens.

A burst of N opens counts as N when they arrive within `burst_window_s` of each other; the largest burst
seen in the last `memory_s` becomes the target, capped by `max_target_size` and by what free memory holds
(`mem_per_sandbox_mib` each, half of MemAvailable at most), and by the sessions the server still admits (a warm
sandbox no session may take is a container past what admission sized for: at 400 sessions open, a learned target
of 128 would have made ~530 containers, past where dockerd lost shims). A trainer that opens 128 sessions per GRPO
step then finds 128 warm sandboxes at the next step instead of waiting for 128 container starts.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable


def available_memory_mib() -> float | None:
    """MemAvailable from /proc/meminfo, in MiB (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class DemandTracker:
    def __init__(self, floor: int, ceiling: int, burst_window_s: float, memory_s: float,
                 mem_per_sandbox_mib: float, clock: Callable[[], float] = time.monotonic,
                 free_mib: Callable[[], float | None] = available_memory_mib,
                 session_room: Callable[[], int] | None = None) -> None:
        self.floor = floor
        self.ceiling = max(floor, ceiling)
        self.burst_window_s = burst_window_s
        self.memory_s = memory_s
        self.mem_per_sandbox_mib = mem_per_sandbox_mib
        self._clock = clock
        self._free_mib = free_mib
        self.session_room = session_room  # sessions the server still admits (None: no bound)
        self._recent: collections.deque[float] = collections.deque()  # open times within the burst window
        self._peak = 0
        self._peak_at = 0.0

    def opened(self) -> None:
        """One open asked for a sandbox."""
        now = self._clock()
        self._recent.append(now)
        while self._recent and now - self._recent[0] > self.burst_window_s:
            self._recent.popleft()
        if len(self._recent) >= self._peak or now - self._peak_at > self.memory_s:
            self._peak, self._peak_at = len(self._recent), now

    @property
    def peak(self) -> int:
        """The largest burst seen within memory_s (0 once it is older)."""
        return self._peak if self._clock() - self._peak_at <= self.memory_s else 0

    def seconds_until_forgotten(self) -> float | None:
        """Seconds until the remembered burst stops counting (the target falls then); None if no burst above
        the floor is remembered."""
        left = self._peak_at + self.memory_s - self._clock()
        return left if self._peak > self.floor and left >= 0 else None

    def memory_ceiling(self) -> int | None:
        free = self._free_mib()
        return None if free is None else int(free / 2 / self.mem_per_sandbox_mib)

    def target(self, held: int = 0) -> int:
        """Warm sandboxes to keep. `held`: warm ones already made (their memory is not free any more)."""
        want = max(self.floor, min(self.peak, self.ceiling))
        if want > self.floor and self.session_room is not None:
            want = max(self.floor, min(want, self.session_room()))
        if want == self.floor:
            return want  # no need to read the free memory for the floor
        room = self.memory_ceiling()
        return want if room is None else max(self.floor, min(want, room + held))
