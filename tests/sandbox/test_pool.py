"""Warm pool, labels, hardening flags, sweep, close, concurrency, dead-man switch: under each backend."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
import uuid

import docker
import pytest

from env_server.sandbox import PoolConfig, SandboxConfig, SandboxPool, SandboxUnavailable
from env_server.sandbox.docker.labels import LABEL_INSTANCE, LABEL_SERVER, LABEL_SESSION
from env_server.sandbox.docker.socket_channel import remove_instance_dirs
from env_server.sandbox.docker.uids import LABEL_UID
from env_server.sandbox.pool import PoolBusy
from tests.harness import bwrap_sandboxes_of, only_backend

from .conftest import SERVER_NAME, fast_config


async def _wait_depth(pool: SandboxPool, depth: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while pool.depth < depth:
        assert time.monotonic() < deadline, f"pool depth {pool.depth} < {depth}"
        await asyncio.sleep(0.05)


@only_backend("docker")
async def test_warm_acquire_is_fast_and_labelled_and_hardened(pool, docker_client, census):
    await _wait_depth(pool, pool.pool_config.target_size)
    sb = await pool.acquire()  # its latency is a benchmark figure (bench/), not asserted here
    try:
        info = docker_client.api.inspect_container(sb.backend_id)
        labels = info["Config"]["Labels"]
        assert labels["tito.managed"] == "1"
        assert labels[LABEL_SERVER] == SERVER_NAME
        assert labels[LABEL_INSTANCE] == pool.instance_id
        assert labels[LABEL_SESSION] == sb.session_id
        hc = info["HostConfig"]
        assert hc["NetworkMode"] == "none" and hc["ReadonlyRootfs"] is True
        assert hc["CapDrop"] == ["ALL"] and "no-new-privileges" in hc["SecurityOpt"]
        assert hc["PidsLimit"] == pool.sandbox_config.host_pids_limit and hc["Init"] is True
        assert hc["Runtime"] == pool.sandbox_config.runtime
        assert hc["Memory"] == 512 << 20 and hc["MemorySwap"] == hc["Memory"]
        assert hc["NanoCpus"] == 1_000_000_000
        uid = labels[LABEL_UID]  # its own host uid (docker/uids.py), in the configured range
        assert info["Config"]["User"] == f"{uid}:{uid}" and int(uid) >= pool.sandbox_config.uid_range_start
        assert f"uid={uid},gid={uid}" in hc["Tmpfs"]["/workspace"]
        assert info["Config"]["StdinOnce"] is True and info["Config"]["OpenStdin"] is True
        assert "/workspace" in hc["Tmpfs"]
        assert (await sb.execute("1 + 1")).value == "2"
    finally:
        await sb.destroy()
        await sb.destroy()  # idempotent
    assert census.of(SERVER_NAME, session=sb.session_id) == []


@only_backend("bwrap")
async def test_a_bwrap_sandbox_has_its_cgroup_limits_and_filter(pool, census):
    """Seen from the host: the sandbox's processes sit in their own cgroup with the configured limits (this
    machine lets root write cgroups), run as an unprivileged host uid of their own, under the seccomp filter."""
    sb = await pool.acquire()
    try:
        [seen] = census.of(SERVER_NAME, session=sb.session_id)
        assert seen.labels["tito.instance"] == pool.instance_id
        repl = sb.handle.repl_pid  # the REPL's host pid, to read its status from outside
        status = dict(line.split(":\t", 1) for line in open(f"/proc/{repl}/status").read().splitlines()
                      if ":\t" in line)
        assert status["Seccomp"].strip() == "2" and status["NoNewPrivs"].strip() == "1"
        assert int(status["CapEff"], 16) == 0
        uid = int(status["Uid"].split()[0])
        if os.geteuid() == 0:  # a host uid of its own, from the configured range (bwrap/uids.py)
            b = pool.sandbox_config.bwrap
            assert b.uid_range_start <= uid < b.uid_range_start + b.uid_range_size and sb.handle.uid.uid == uid
        else:
            assert uid == os.geteuid()
        cgroup = sb.handle.cgroup
        assert cgroup is not None and set(cgroup.dirs) == {"memory", "pids", "cpu"}
        assert repl in cgroup.pids()
        v2 = cgroup.version == 2
        assert int((cgroup.dirs["pids"] / "pids.max").read_text()) == pool.sandbox_config.pids_limit
        memory = cgroup.dirs["memory"] / ("memory.max" if v2 else "memory.limit_in_bytes")
        assert int(memory.read_text()) == 512 << 20
        quota = (cgroup.dirs["cpu"] / "cpu.max").read_text().split()[0] if v2 else \
            (cgroup.dirs["cpu"] / "cpu.cfs_quota_us").read_text()
        assert int(quota) == 100_000  # one CPU per 100 ms period
        assert (await sb.execute("1 + 1")).value == "2"
    finally:
        await sb.destroy()
    assert census.of(SERVER_NAME, session=sb.session_id) == []
    assert not any(d.exists() for d in cgroup.dirs.values())


async def test_pool_refills_in_the_background(pool):
    await _wait_depth(pool, pool.pool_config.target_size)
    taken = [await pool.acquire() for _ in range(pool.pool_config.target_size + 1)]  # +1 on demand
    try:
        await _wait_depth(pool, pool.pool_config.target_size)
    finally:
        await asyncio.gather(*(sb.destroy() for sb in taken))


async def test_concurrent_executes_on_16_sandboxes_see_only_their_own(pool):
    sbs = await asyncio.gather(*(pool.acquire() for _ in range(16)))
    try:
        assert len({sb.backend_id for sb in sbs}) == 16

        async def work(i: int, sb) -> None:
            await sb.execute(f"mine = {i}")
            for j in range(10):
                r = await sb.execute(f"print('s{i}-{j}'); mine")
                assert r.stdout == f"s{i}-{j}\n" and r.value == str(i), r

        await asyncio.gather(*(work(i, sb) for i, sb in enumerate(sbs)))
    finally:
        await asyncio.gather(*(sb.destroy() for sb in sbs))


async def test_startup_sweep_removes_a_previous_instance(backend, census):
    name = f"{SERVER_NAME}-sweep-{backend}"
    old = SandboxPool(fast_config(backend), PoolConfig(target_size=2), server_name=name,
                      instance_id="old")
    await old.start()
    await _wait_depth(old, 2)
    handed_out = await old.acquire()
    # Abandon `old` as a crashed server would: stop its refill, never close it.
    old._refill_task.cancel()  # noqa: SLF001
    await asyncio.sleep(0.1)
    old_ids = {c.id for c in census.of(name)}
    assert handed_out.backend_id in old_ids and len(old_ids) >= 2

    new = SandboxPool(fast_config(backend), PoolConfig(target_size=1), server_name=name, instance_id="new")
    try:
        await new.start()
        left = {c.id for c in census.of(name)}
        assert not (left & old_ids), "the sweep left sandboxes of the previous instance"
        r = await handed_out.execute("1")
        assert r.lost  # its sandbox is gone; reported, not raised
        await _wait_depth(new, 1)
    finally:
        await new.close()
        await old.close()
    assert census.of(name) == []


async def test_close_removes_everything_of_the_instance(backend, census):
    name = f"{SERVER_NAME}-close-{backend}"
    p = SandboxPool(fast_config(backend), PoolConfig(target_size=2), server_name=name,
                    instance_id=uuid.uuid4().hex[:8])
    await p.start()
    held = await p.acquire()
    await _wait_depth(p, 1)
    assert len(census.of(name)) >= 2
    await p.close()
    assert census.of(name) == []
    assert not held.alive or (await held.execute("1")).lost
    with pytest.raises(SandboxUnavailable):
        await p.acquire()


async def test_missing_image_is_not_ready_with_a_clear_message(backend):
    p = SandboxPool(fast_config(backend, image="tito-sandbox-python:no-such-tag"), PoolConfig(target_size=1),
                    server_name=f"{SERVER_NAME}-noimg", instance_id="x")
    await p.start()
    hint = "docker build" if backend == "docker" else "scripts/build_rootfs.sh"
    try:
        assert not p.ready and p.missing_image
        assert ("not found" if backend == "docker" else "no root filesystem") in p.reason and hint in p.reason
        with pytest.raises(SandboxUnavailable, match=hint):
            await p.acquire()
    finally:
        await p.close()


def test_dead_server_leaves_no_running_sandbox(backend, census):
    """Dead-man switch: SIGKILL the process holding the sandbox's stdio; the sandbox ends too (docker: the REPL
    sees EOF and exits; bwrap: that, and bwrap's parent-death signal)."""
    name = f"{SERVER_NAME}-deadman-{backend}"
    script = textwrap.dedent(f"""
        import asyncio, concurrent.futures, os, signal
        from env_server.sandbox import Sandbox, make_sandbox_backend
        from tests.sandbox.conftest import fast_config
        async def main():
            config = fast_config({backend!r})
            backend = make_sandbox_backend(config, server_name={name!r}, instance_id="doomed")
            backend.probe(config.image)
            sb = await Sandbox.create(backend, config, executor=concurrent.futures.ThreadPoolExecutor(2))
            assert (await sb.execute("1")).value == "1"
            print(sb.backend_id, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        asyncio.run(main())
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=root)
    assert proc.returncode == -9, proc.stderr
    sandbox_id = proc.stdout.strip()
    try:
        deadline = time.monotonic() + 10
        while True:
            if backend == "docker":
                running = docker.from_env().api.inspect_container(sandbox_id)["State"]["Running"]
            else:
                running = any(c.id == sandbox_id for c in bwrap_sandboxes_of(name, running_only=True))
            if not running:
                break
            assert time.monotonic() < deadline, "sandbox still running after its server died"
            time.sleep(0.1)
    finally:
        if backend == "docker":
            docker.from_env().api.remove_container(sandbox_id, force=True)
            remove_instance_dirs(SandboxConfig().socket_dir, name)
        else:  # the cgroup folders a killed server leaves: the next start's sweep would remove them
            from env_server.sandbox import make_sandbox_backend

            make_sandbox_backend(fast_config(backend), server_name=name, instance_id="cleanup").sweep()


async def test_opens_beyond_the_start_slots_queue_in_order_and_time_out_with_a_retry_hint(backend, census):
    """One start slot: a second open waits for it (its own start is not timed while it waits); with a
    short admission wait, a third gets PoolBusy naming the setting and saying to retry."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    cfg = PoolConfig(target_size=0, learn_demand=False, max_concurrent_starts=1, admission_timeout_s=60,
                     create_timeout_s=20)
    p = SandboxPool(fast_config(backend), cfg, server_name=name, instance_id="adm")
    await p.start()
    try:
        t0 = time.monotonic()
        first, second = await asyncio.gather(p.acquire(), p.acquire())
        assert first.alive and second.alive and p.admission_waiting == 0
        one_start = (time.monotonic() - t0) / 2
        await asyncio.gather(first.destroy(), second.destroy())

        p.pool_config = p.pool_config.model_copy(update={"admission_timeout_s": max(0.01, one_start / 4)})
        results = await asyncio.gather(*(p.acquire() for _ in range(3)), return_exceptions=True)
        made = [r for r in results if not isinstance(r, BaseException)]
        busy = [r for r in results if isinstance(r, PoolBusy)]
        assert len(made) >= 1 and busy, results  # the slot's holder starts; who waits too long is told so
        msg = str(busy[0])
        assert "overloaded" in msg and "pool.admission_timeout_s" in msg and "retry" in msg
        assert p.busy_total == len(busy)
        await asyncio.gather(*(sb.destroy() for sb in made))
        # The slot is free again afterwards: a refused wait did not keep it.
        sb = await p.acquire()
        await sb.destroy()
    finally:
        await p.close()
    assert census.of(name) == []


async def test_a_warm_sandbox_that_dies_while_waiting_is_replaced(backend, census):
    name = f"test-{uuid.uuid4().hex[:8]}"
    p = SandboxPool(fast_config(backend), PoolConfig(target_size=1), server_name=name, instance_id="dead-idle")
    await p.start()
    try:
        await _wait_depth(p, 1)
        [first] = list(p._idle)  # noqa: SLF001 - the test looks at the pool's warm sandbox
        census.kill_from_outside(first)
        deadline = time.monotonic() + 30
        while not (p.depth == 1 and first not in p._idle):  # noqa: SLF001
            assert time.monotonic() < deadline, "the dead warm sandbox was not replaced"
            await asyncio.sleep(0.1)
        sb = await p.acquire()
        assert sb is not first and (await sb.execute("1 + 1")).value == "2"
        await sb.destroy()
    finally:
        await p.close()
    assert census.of(name) == []
