"""Warm pool of started sandboxes: bounded-rate background refill, start-up sweep, clean close.

The pool is a small state machine; every transition goes through `_enter`, which logs it and
tells the listeners (the server sets gRPC health from it):

    NOT_STARTED --start--> READY | UNAVAILABLE      (backend usable and image present, or not)
    READY <--probe--> UNAVAILABLE                   (a failed create re-probes; the refill loop retries)
    any --close--> CLOSED
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import enum
import logging
import os
import weakref
from typing import Any, Callable, TypeVar

from .backend import SandboxBackend
from .backends import make_sandbox_backend
from .config import PoolConfig, SandboxConfig
from .demand import DemandTracker
from .errors import BackendUnavailable, SandboxError, SandboxUnavailable
from .sandbox import Sandbox

log = logging.getLogger(__name__)
T = TypeVar("T")
_MAX_BACKOFF_S = 30.0
# While warm sandboxes are being taken (a burst), the refill holds off this long after the last acquire:
# container starts would compete for the CPU with the burst they are meant to serve.
_REFILL_QUIET_S = 0.5


class PoolBusy(SandboxUnavailable):
    """Every start slot stayed taken for admission_timeout_s: the server is overloaded now; retry later."""


class PoolState(enum.Enum):
    NOT_STARTED = "not started"
    READY = "ready"
    UNAVAILABLE = "unavailable"  # backend unusable (dockerd down, no bwrap) or image missing: `reason` says which
    CLOSED = "closed"


class SandboxPool:
    def __init__(self, sandbox: SandboxConfig, pool: PoolConfig, server_name: str, instance_id: str,
                 sweep_at_start: bool = True, backend: SandboxBackend | None = None):
        self.sandbox_config = sandbox
        self.pool_config = pool
        self.server_name = server_name
        self.instance_id = instance_id
        # Where its sandboxes run (sandbox.backend); pools of one server may share one.
        self.backend = backend or make_sandbox_backend(sandbox, server_name=server_name, instance_id=instance_id,
                                               threads=pool.docker_threads)
        self._owns_backend = backend is None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._idle: collections.deque[Sandbox] = collections.deque()
        self._made: weakref.WeakSet[Sandbox] = weakref.WeakSet()
        self._creating = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._refill_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.state = PoolState.NOT_STARTED
        self.reason: str | None = "sandbox pool not started"  # why it is not READY
        self.missing_image = False  # the last probe found no such image
        self._listeners: list[Callable[[PoolState], Any]] = []
        # The start-up sweep of what earlier instances of this server_name left; a pool made while the server
        # serves (a task image's) leaves it to the pools made at start.
        self._swept = not sweep_at_start
        self.created_total = 0
        self.failed_total = 0
        self._backoff = 0.0  # seconds to wait before the next refill attempt after failures
        # Admission of on-demand starts: a FIFO semaphore, so a storm of opens queues fairly and each
        # start's own timeout (create_timeout_s) measures the start, not the wait for a slot.
        self._start_slots = asyncio.Semaphore(pool.max_concurrent_starts)
        self.admission_waiting = 0
        self.busy_total = 0  # opens refused after admission_timeout_s
        self.cold_total = 0  # opens that found no warm sandbox and started their own
        self.demand = DemandTracker(
            floor=pool.target_size, ceiling=pool.max_target_size if pool.learn_demand else pool.target_size,
            burst_window_s=pool.burst_window_s, memory_s=pool.demand_memory_s,
            mem_per_sandbox_mib=pool.mem_per_sandbox_mib)
        self.max_creates = pool.max_concurrent_creates or max(2, os.cpu_count() or 2)
        self._last_acquire = float("-inf")

    # -- state ------------------------------------------------------------------------------------

    def on_change(self, listener: Callable[[PoolState], Any]) -> None:
        """Call `listener(state)` on every transition (an async listener is scheduled)."""
        self._listeners.append(listener)

    def _enter(self, state: PoolState, reason: str | None = None) -> None:
        changed = state is not self.state or reason != self.reason
        self.state, self.reason = state, reason
        if not changed:
            return
        if state is PoolState.READY:
            log.info("sandbox pool ready (image %s, server %s, instance %s)", self.sandbox_config.image,
                     self.server_name, self.instance_id)
        elif state is PoolState.UNAVAILABLE:
            log.error("sandbox pool not ready: %s", reason)
        for listener in self._listeners:
            outcome = listener(state)
            if asyncio.iscoroutine(outcome):
                self._spawn(outcome)

    @property
    def ready(self) -> bool:
        """Image present and backend usable (and the pool not closed)."""
        return self.state is PoolState.READY

    @property
    def _closed(self) -> bool:
        return self.state is PoolState.CLOSED

    @property
    def depth(self) -> int:
        """Ready containers waiting in the pool."""
        return sum(1 for sb in self._idle if sb.alive)

    @property
    def in_use(self) -> int:
        """Sandboxes handed out to sessions and still serving."""
        idle = set(map(id, self._idle))
        return sum(1 for sb in self._made if sb.alive and id(sb) not in idle)

    @property
    def status_detail(self) -> str:
        """One line for health checks and UNAVAILABLE errors."""
        if self.state is PoolState.READY:
            note = self.backend.limits_note
            return (f"ready: {self.depth} warm of {self.demand.target(len(self._idle))}, "
                    f"{self._creating} starting, image {self.sandbox_config.image} ({self.backend.name} backend"
                    + (f"; {note})" if note else ")"))
        if self.state is PoolState.CLOSED:
            return "sandbox pool closed"
        return self.reason or f"sandbox pool {self.state.value}"

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._executor is None:
            raise SandboxUnavailable("sandbox pool is not started")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Checks backend and image, sweeps what a previous server left, then fills in the background."""
        if self._executor is not None:
            return
        self._executor = concurrent.futures.ThreadPoolExecutor(
            self.pool_config.docker_threads, thread_name_prefix=f"tito-{self.backend.name}")
        await self._probe()
        self._refill_task = asyncio.get_running_loop().create_task(self._refill_loop(),
                                                                   name="sandbox-pool-refill")
        cfg = self.pool_config
        log.info("sandbox pool: %d warm%s, refill %d at a time, on-demand starts max_concurrent_starts=%d, "
                 "admission wait %.0f s, start timeout %.0f s", cfg.target_size,
                 f" (up to {cfg.max_target_size} as demand grows)" if cfg.learn_demand else "", self.max_creates,
                 cfg.max_concurrent_starts, cfg.admission_timeout_s, cfg.create_timeout_s)

    async def _probe(self) -> bool:
        """(Re)checks the backend and the image; sweeps on the first success."""
        try:
            await self._run(self.backend.probe, self.sandbox_config.image)
        except BackendUnavailable as exc:
            self.missing_image = exc.missing_image
            if not self._closed:
                self._enter(PoolState.UNAVAILABLE, str(exc))
            return False
        self.missing_image = False
        if not self._swept:
            self._swept = True
            await self.sweep()
        recovered = self.state is PoolState.UNAVAILABLE
        if not self._closed:
            self._enter(PoolState.READY)
        if recovered:  # removals that failed while the backend was away (dockerd restarting) are done now
            try:
                removed = await self._run(self.backend.remove_stopped)
            except Exception as exc:  # noqa: BLE001 - a failed clean-up must not stop the pool
                log.warning("could not remove the sandboxes that stopped while the backend was unreachable: %s", exc)
            else:
                if removed:
                    log.info("removed %d sandbox(es) that stopped while the backend was unreachable", removed)
        return True

    async def sweep(self) -> int:
        """Removes the sandboxes of this server_name left by other (previous) instances."""
        try:
            removed = await self._run(lambda: self.backend.sweep(keep_instance=self.instance_id))
        except Exception as exc:  # noqa: BLE001 - a failed sweep must not stop the server
            log.warning("sweep of leftover sandboxes failed: %s", exc)
            return 0
        if removed:
            log.info("swept %d leftover sandbox(es) of server %r", removed, self.server_name)
        return removed

    async def close(self, instance_wide: bool = True) -> None:
        """Destroys everything this pool started (pooled, handed out, being created). `instance_wide`: then
        also sweeps every sandbox of the instance (a create that raced the cancellation); pools that share the
        instance id with others still serving (SandboxPools) leave that to the last one."""
        if self._closed:
            return
        self._enter(PoolState.CLOSED)
        tasks = [t for t in (self._refill_task, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Snapshot before clearing: _made is weak, so pooled sandboxes must stay referenced here.
        sandboxes = {*self._idle, *self._made}
        self._idle.clear()
        await asyncio.gather(*(sb.destroy() for sb in sandboxes), return_exceptions=True)
        executor, self._executor = self._executor, None
        if executor is not None:
            # Lets cleanups of cancelled creates finish (they remove their own sandboxes).
            await asyncio.to_thread(executor.shutdown, wait=True)
        if executor is not None and instance_wide:
            try:  # anything of ours still there (e.g. a create that raced the cancellation)
                await asyncio.to_thread(self.backend.sweep, only_instance=self.instance_id)
            except Exception as exc:  # noqa: BLE001
                log.warning("final sweep failed: %s", exc)
        if self._owns_backend:
            await asyncio.to_thread(self.backend.close)

    # -- sandboxes --------------------------------------------------------------------------------

    async def _create(self) -> Sandbox:
        assert self._executor is not None
        try:
            self.backend.check_disk()
        except BackendUnavailable as exc:  # not ready (health follows) until a probe finds space again
            self._enter(PoolState.UNAVAILABLE, str(exc))
            raise
        sb = await Sandbox.create(self.backend, self.sandbox_config, executor=self._executor,
                                  timeout_s=self.pool_config.create_timeout_s)
        self._made.add(sb)
        self.created_total += 1
        return sb

    async def acquire(self) -> Sandbox:
        """A ready sandbox, from the pool or created on demand. Raises SandboxUnavailable/SandboxError."""
        if self._closed:
            raise SandboxUnavailable("sandbox pool is closed")
        if not self.ready:
            if self._executor is None:
                raise SandboxUnavailable("sandbox pool is not started")
            if not await self._probe():
                raise SandboxUnavailable(f"sandbox pool not ready: {self.reason}")
        self.demand.opened()
        self._last_acquire = asyncio.get_running_loop().time()
        try:
            self._drop_dead_idle()
            if self._idle:
                return self._idle.popleft()
            await self._admit()
            try:
                self._drop_dead_idle()
                if self._idle:  # the refill made one while this open waited
                    return self._idle.popleft()
                self.cold_total += 1
                return await self._create()
            except SandboxError:
                self.failed_total += 1
                raise
            finally:
                self._start_slots.release()
        finally:
            self._wake.set()

    async def _admit(self) -> None:
        """Waits for a start slot, at most admission_timeout_s; raises PoolBusy after that."""
        cfg = self.pool_config
        self.admission_waiting += 1
        try:
            async with asyncio.timeout(cfg.admission_timeout_s):
                await self._start_slots.acquire()
        except TimeoutError:
            self.busy_total += 1
            raise PoolBusy(
                f"the server is overloaded: this open waited {cfg.admission_timeout_s:.0f} s "
                f"(pool.admission_timeout_s) for one of {cfg.max_concurrent_starts} sandbox start slots "
                f"({self.admission_waiting - 1} other opens waiting); retry in a few seconds, or give the server "
                "a larger pool.target_size or pool.max_concurrent_starts") from None
        finally:
            self.admission_waiting -= 1

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fill_one(self) -> None:
        try:
            sb = await self._create()
        except SandboxError as exc:
            self.failed_total += 1
            self._backoff = min(_MAX_BACKOFF_S, self._backoff * 2 or self.pool_config.retry_backoff_s)
            log.warning("sandbox pool: create failed (%s); retrying in %.1f s", exc, self._backoff)
            # Daemon gone or image removed? Not ready (health follows) until a probe succeeds again.
            await self._probe()
        else:
            self._backoff = 0.0
            if self._closed:
                await sb.destroy()
            else:
                # A warm sandbox that dies while it waits (OOM-killed, removed from outside) wakes the
                # refill, which drops and replaces it.
                sb.on_death(self._wake.set)
                self._idle.append(sb)
        finally:
            self._creating -= 1
            self._wake.set()

    async def _refill_loop(self) -> None:
        cfg = self.pool_config
        while not self._closed:
            if not self.ready:
                if not await self._probe():
                    await asyncio.sleep(cfg.probe_interval_s)
                    continue
            if self._backoff:
                await asyncio.sleep(self._backoff)
            self._drop_dead_idle()
            since = asyncio.get_running_loop().time() - self._last_acquire
            if self._idle and since < _REFILL_QUIET_S:
                await asyncio.sleep(_REFILL_QUIET_S - since)
                continue
            target = self.demand.target(held=len(self._idle) + self._creating)
            missing = target - len(self._idle) - self._creating
            while missing > 0 and self._creating < self.max_creates:
                self._creating += 1
                missing -= 1
                self._spawn(self._fill_one())
            while len(self._idle) > target:  # demand fell: give back the memory of the warm surplus
                self._spawn(self._idle.popleft().destroy())
            self._wake.clear()
            # Woken by acquires, finished creates and warm sandboxes that died; and when a learned burst is
            # forgotten, to give back the surplus.
            forget_in = self.demand.seconds_until_forgotten()
            try:
                async with asyncio.timeout(None if forget_in is None else forget_in + 0.05):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _drop_dead_idle(self) -> None:
        """Removes the warm sandboxes that died while they waited."""
        if all(sb.alive for sb in self._idle):
            return
        for sb in self._idle:
            if not sb.alive:
                self._spawn(sb.destroy())
        self._idle = collections.deque(sb for sb in self._idle if sb.alive)
