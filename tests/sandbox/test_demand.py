"""The pool's target follows demand: unit rules of DemandTracker (a fake clock), then a real pool that
grows to a burst it has seen and shrinks back once the burst is forgotten."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

from env_server.sandbox import PoolConfig, SandboxPool
from env_server.sandbox.demand import DemandTracker

from .conftest import containers_with, fast_config


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _tracker(clock, free_mib=100_000.0, **kw):
    args = dict(floor=2, ceiling=64, burst_window_s=10, memory_s=60, mem_per_sandbox_mib=16)
    args.update(kw)
    return DemandTracker(**args, clock=clock, free_mib=lambda: free_mib)


def test_the_target_is_the_largest_recent_burst_within_floor_ceiling_and_memory():
    clock = Clock()
    d = _tracker(clock)
    assert d.target() == 2 and d.seconds_until_forgotten() is None  # quiet: the floor
    for _ in range(40):
        d.opened()
    assert d.peak == 40 and d.target() == 40
    clock.now += 11  # opens spread out do not add up to a burst
    for _ in range(3):
        d.opened()
        clock.now += 11
    assert d.target() == 40  # the burst is remembered for memory_s...
    assert d.seconds_until_forgotten() == 60 - 44
    clock.now += 61
    assert d.target() == 2 and d.seconds_until_forgotten() is None  # ...then forgotten
    for _ in range(100):
        d.opened()
    assert d.target() == 64  # capped by the ceiling
    tight = _tracker(clock, free_mib=320.0)  # half of 320 MiB at 16 MiB each: 10 more
    for _ in range(50):
        tight.opened()
    assert tight.target() == 10 and tight.target(held=10) == 20


async def test_a_pool_grows_to_a_burst_it_has_seen_and_shrinks_when_it_is_forgotten(docker_ok, docker_client):
    name = f"test-{uuid.uuid4().hex[:8]}"
    # The burst is remembered for 20 s: the refill of 5 containers must finish within it (8 s was too short
    # beside a parallel test run's load: the target fell back to the floor first).
    p = SandboxPool(fast_config(), PoolConfig(target_size=1, max_target_size=6, demand_memory_s=20),
                    server_name=name, instance_id="demand")
    await p.start()
    try:
        burst = await asyncio.gather(*(p.acquire() for _ in range(6)))
        await asyncio.gather(*(sb.destroy() for sb in burst))
        deadline = time.monotonic() + 60
        while p.depth < 6:  # the next burst of 6 will find them warm
            assert time.monotonic() < deadline, f"pool depth {p.depth} < 6"
            await asyncio.sleep(0.1)
        t0 = time.monotonic()
        again = await asyncio.gather(*(p.acquire() for _ in range(6)))
        assert time.monotonic() - t0 < 1.0  # six warm acquires, no container start
        await asyncio.gather(*(sb.destroy() for sb in again))
        deadline = time.monotonic() + 90
        while len(containers_with(docker_client, server=name)) > 1:  # forgotten after 20 s: back to the floor
            assert time.monotonic() < deadline, "the pool did not shrink back to its floor"
            await asyncio.sleep(0.2)
        assert p.depth == 1
    finally:
        await p.close()
    assert containers_with(docker_client, server=name) == []


def test_learning_can_be_switched_off():
    p = SandboxPool(fast_config(), PoolConfig(target_size=3, learn_demand=False), server_name="x", instance_id="y")
    for _ in range(50):
        p.demand.opened()
    assert p.demand.target() == 3


def test_creates_default_to_the_machine():
    p = SandboxPool(fast_config(), PoolConfig(), server_name="x", instance_id="y")
    assert p.max_creates == max(2, os.cpu_count() or 2)
    assert SandboxPool(fast_config(), PoolConfig(max_concurrent_creates=3), server_name="x", instance_id="y").max_creates == 3


def test_a_learned_target_stays_within_the_sessions_the_server_still_admits():
    """At the admitted maximum a warm sandbox is a container no session may take: the learned target falls to
    the floor as the server fills, and comes back as sessions close (the floor is kept at any fill)."""
    clock = Clock()
    room = [400]
    d = _tracker(clock, ceiling=128, session_room=lambda: room[0])
    for _ in range(128):
        d.opened()
    assert d.target() == 128
    room[0] = 30
    assert d.target() == 30
    room[0] = 0
    assert d.target() == 2  # the floor
    room[0] = 1000
    assert d.target() == 128
