"""The server's sandbox pools: one warm pool per sandbox image.

- `sandbox.image` (the main pool: the server's health follows it) and each environment's own image
  (`Environment.sandbox_image`, or config `environment_images`) get their pool when the server starts.
- Task images (a session's env_args `image`, e.g. a SWE-style task that brings its repository and
  dependencies) get theirs at their first open, if config `task_images` allows the name (fnmatch patterns).
  Their warm floor is `pool.task_images_target_size` (0): they start cold and keep as many warm as the
  learned demand says (a burst of opens is remembered, pool.py/demand.py). A task image that is missing
  closes its pool again, so a later open looks again.

Every pool starts its sandboxes with the same SandboxConfig (the hardening) but for the image.
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import Callable, Iterable

from .config import PoolConfig, SandboxConfig
from .pool import SandboxPool


class SandboxPools:
    def __init__(self, sandbox: SandboxConfig, pool: PoolConfig, server_name: str, instance_id: str,
                 task_images: Iterable[str] = ()) -> None:
        self.sandbox_config = sandbox
        self.pool_config = pool
        self.server_name = server_name
        self.instance_id = instance_id
        self.task_images = tuple(task_images)
        self.main = SandboxPool(sandbox, pool, server_name, instance_id)
        self.by_image: dict[str, SandboxPool] = {sandbox.image: self.main}
        self._by_environment: dict[str, SandboxPool] = {}
        self._starts: dict[str, asyncio.Task[None]] = {}
        self._session_room: Callable[[], int] | None = None

    def bound_by_sessions(self, room: Callable[[], int]) -> None:
        """Learned warm targets stay within `room()`, the sessions the server still admits (the configured floor
        is kept): past that, a warm sandbox is a container no session may take (demand.py)."""
        self._session_room = room
        for pool in self.by_image.values():
            pool.demand.session_room = room

    def _add(self, image: str, target_size: int, sweep_at_start: bool = True) -> SandboxPool:
        pool = self.by_image.get(image)
        if pool is None:
            # They share the instance id, so their start-up sweeps spare each other.
            pool = SandboxPool(self.sandbox_config.model_copy(update={"image": image}),
                               self.pool_config.model_copy(update={"target_size": target_size}),
                               self.server_name, self.instance_id, sweep_at_start=sweep_at_start)
            pool.demand.session_room = self._session_room
            self.by_image[image] = pool
        return pool

    def add_environment(self, name: str, image: str | None) -> SandboxPool:
        """The pool of an environment's image (None: sandbox.image), made now; started with the others."""
        pool = self._add(image or self.sandbox_config.image, self.pool_config.other_images_target_size)
        self._by_environment[name] = pool
        return pool

    def of_environment(self, name: str) -> SandboxPool:
        return self._by_environment[name]

    def allows(self, image: str) -> bool:
        """Does config task_images allow a session to ask for this image?"""
        return any(fnmatch.fnmatchcase(image, pattern) for pattern in self.task_images)

    async def task_pool(self, image: str) -> SandboxPool:
        """The pool of an allowed task image, made and started at its first open (concurrent opens share the
        start). Not ready when the image is missing (the pool is then closed and forgotten) or dockerd is down:
        `pool.reason` says which."""
        pool = self.by_image.get(image)
        if pool is None:
            pool = self._add(image, self.pool_config.task_images_target_size, sweep_at_start=False)
            self._starts[image] = asyncio.get_running_loop().create_task(pool.start(), name=f"pool-start-{image}")
        start = self._starts.get(image)
        if start is not None:
            await asyncio.shield(start)
        if (not pool.ready and pool.missing_image and self.by_image.get(image) is pool
                and pool not in self._by_environment.values()):
            del self.by_image[image]
            self._starts.pop(image, None)
            await pool.close(instance_wide=False)  # the other pools of the instance go on serving
        return pool

    async def start(self) -> None:
        await asyncio.gather(*(p.start() for p in self.by_image.values()))

    async def close(self) -> None:
        """Closes every pool: the others first, each with its own sandboxes; then the main pool, which also sweeps
        the instance's leftovers (so no pool's sweep removes what another still starts)."""
        for task in self._starts.values():
            task.cancel()
        await asyncio.gather(*self._starts.values(), return_exceptions=True)
        others = [p for p in self.by_image.values() if p is not self.main]
        await asyncio.gather(*(p.close(instance_wide=False) for p in others))
        await self.main.close()
