"""trainer/malloc.py: with the raised thresholds, a large freed allocation stays in the process (the next step reuses
it instead of faulting in fresh pages); without them glibc gives it back. Each case runs in a fresh interpreter,
since mallopt changes the process for good."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PROBE = """
import sys
from trainer.malloc import keep_freed_memory, return_freed_memory
took = {"keep": keep_freed_memory, "return": return_freed_memory}.get(sys.argv[1], lambda: None)()

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

before = rss_kib()
for _ in range(int(sys.argv[2])):
    block = bytearray(int(sys.argv[3]) << 20)  # written (zeroed) page by page
    del block
print(took, rss_kib() - before)
"""


def _run(mode: str, times: int = 1, mib: int = 64, **env: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode, str(times), str(mib)], capture_output=True, text=True, check=True,
                         env={**os.environ, **env}).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_memory_stays_in_the_process_only_with_the_raised_thresholds():
    took, kept_kib = _run("keep")
    assert took == "True" and kept_kib > 60 << 10  # the 64 MiB are still the process's
    took, given_back_kib = _run("default")
    assert took == "None" and given_back_kib < 8 << 10  # glibc's default: an mmap'd block, unmapped when freed


def test_a_users_own_malloc_setting_is_left_alone():
    took, given_back_kib = _run("keep", MALLOC_MMAP_THRESHOLD_="131072")
    assert took == "False" and given_back_kib < 8 << 10


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_return_freed_gives_back_what_glibcs_rising_threshold_keeps():
    # glibc's default: the first 16 MiB block is an mmap; freeing it raises the threshold, so the second comes from
    # the heap and stays there (below the trim threshold, which rose with it). A 0.5B model's weights are such blocks.
    took, kept_kib = _run("default", times=2, mib=16)
    assert took == "None" and kept_kib > 12 << 10
    took, given_back_kib = _run("return", times=2, mib=16)
    assert took == "True" and given_back_kib < 4 << 10
