"""One answer per key: the rule that makes retried OpenSession and Step calls safe.

The first call with a key starts the work as a task; a retry with the same key, while it runs
or after it finished, awaits that same task instead of starting the work again. The task is
shielded, so a caller that gives up (deadline, dropped connection) does not stop the work
half-way: it runs to its end and its answer waits for the retry. A key whose work raised is
forgotten, so the client may fix its request and send it again.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class OnceByKey(Generic[K, T]):
    """Remembers the outcome of the last `capacity` keys (oldest forgotten first)."""

    def __init__(self, capacity: int, name: str = "call") -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.name = name
        self._tasks: OrderedDict[K, asyncio.Task[T]] = OrderedDict()

    def get(self, key: K) -> asyncio.Task[T] | None:
        return self._tasks.get(key)

    @property
    def latest(self) -> tuple[K, asyncio.Task[T]] | None:
        """The most recently started key and its task."""
        if not self._tasks:
            return None
        key = next(reversed(self._tasks))
        return key, self._tasks[key]

    def start(self, key: K, work: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        """Start the work for a key that has none (raises if it has)."""
        if key in self._tasks:
            raise KeyError(f"{self.name} {key!r} already started")
        task = asyncio.ensure_future(work())
        task.set_name(f"{self.name}-{key}")
        task.add_done_callback(lambda t, key=key: self._settled(key, t))
        self._tasks[key] = task
        while len(self._tasks) > self.capacity:
            self._tasks.popitem(last=False)
        return task

    async def run(self, key: K, work: Callable[[], Awaitable[T]]) -> T:
        """The answer for `key`: the running or finished task's, or a new one's."""
        task = self._tasks.get(key) or self.start(key, work)
        return await asyncio.shield(task)

    def _settled(self, key: K, task: asyncio.Task[T]) -> None:
        # Retrieved here so an answer whose caller went away is never reported as "never retrieved".
        failed = task.cancelled() or task.exception() is not None
        if failed and self._tasks.get(key) is task:
            del self._tasks[key]
