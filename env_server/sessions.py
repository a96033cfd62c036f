"""Session registry: the live sessions and their leases.

A session is an episode (its environment, sandbox and step state; `episode.py`) plus a lease:
an idle TTL (refreshed by every call and by the end of every step) and a hard TTL (from
opening). A reaper closes expired sessions, so a client that dies leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

from env_server.episode import Episode
from env_server.errors import SessionNotFound

if TYPE_CHECKING:
    from env_server.sandbox.sandbox import Sandbox

log = logging.getLogger(__name__)


@dataclass
class Session:
    id: str
    env_name: str
    episode: Episode
    idle_ttl_s: float
    hard_ttl_s: float
    opened_at: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def expiry_reason(self, now: float) -> str | None:
        if now - self.opened_at >= self.hard_ttl_s:
            return "hard TTL expired"
        idle_since = max(self.last_used, self.episode.settled_at)
        if now - idle_since >= self.idle_ttl_s and not self.episode.busy:
            return "idle TTL expired"
        return None


class SessionRegistry:
    def __init__(
        self,
        max_sessions: int,
        on_closed: Callable[[Session, str], None] | None = None,
        tombstones: int = 10_000,
        limit_why: str = "",
    ) -> None:
        self.max_sessions = max_sessions
        self.limit_why = limit_why  # what set max_sessions (capacity.py), for the RESOURCE_EXHAUSTED message
        self._sessions: dict[str, Session] = {}
        self._reserved = 0  # sessions being opened (their sandbox is on its way)
        # Closed ids and why, so a late Step gets "closed (idle TTL expired)" rather than "unknown".
        self._tombstones: OrderedDict[str, str] = OrderedDict()
        self._tombstone_cap = tombstones
        self._on_closed = on_closed
        self._reaper: asyncio.Task | None = None
        # Container removals of closed sessions, running after CloseSession has answered.
        self._removals: set[asyncio.Task] = set()

    def __len__(self) -> int:
        return len(self._sessions)

    def room(self) -> int:
        """Sessions that may still open (those being opened count as open)."""
        return max(0, self.max_sessions - len(self._sessions) - self._reserved)

    @contextmanager
    def reserve_slot(self) -> Iterator[bool]:
        """Holds a place for a session being opened; yields False when the server is full."""
        if len(self._sessions) + self._reserved >= self.max_sessions:
            yield False
            return
        self._reserved += 1
        try:
            yield True
        finally:
            self._reserved -= 1

    def add(self, session: Session) -> None:
        self._sessions[session.id] = session

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionNotFound(session_id, self._tombstones.get(session_id))
        return session

    async def close(self, session_id: str, reason: str) -> bool:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        self._tombstones[session_id] = reason
        while len(self._tombstones) > self._tombstone_cap:
            self._tombstones.popitem(last=False)
        sandbox = await _teardown(session)
        if sandbox is not None:
            task = asyncio.get_running_loop().create_task(sandbox.destroy())
            self._removals.add(task)
            task.add_done_callback(self._removals.discard)
        if self._on_closed:
            self._on_closed(session, reason)
        return True

    async def close_all(self, reason: str) -> None:
        await asyncio.gather(*(self.close(sid, reason) for sid in list(self._sessions)))
        await self.wait_removals()

    async def wait_removals(self) -> None:
        """Until every closed session's container is removed."""
        while self._removals:
            await asyncio.gather(*list(self._removals), return_exceptions=True)

    def start_reaper(self, interval_s: float) -> None:
        self._reaper = asyncio.create_task(self._reap_forever(interval_s), name="session-reaper")

    async def stop_reaper(self) -> None:
        if self._reaper:
            self._reaper.cancel()
            try:
                await self._reaper
            except asyncio.CancelledError:
                pass

    async def reap_once(self) -> int:
        now = time.monotonic()
        expired = [(s.id, r) for s in list(self._sessions.values()) if (r := s.expiry_reason(now))]
        for sid, reason in expired:
            log.info("closing session %s: %s", sid, reason)
        await asyncio.gather(*(self.close(sid, reason) for sid, reason in expired))
        return len(expired)

    async def _reap_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.reap_once()
            except Exception:  # the reaper must outlive any one bad teardown
                log.exception("session reaper failed; retrying next round")


async def _teardown(session: Session) -> Sandbox | None:
    """The environment's hook, then the sandbox stops serving (its channel closes); the sandbox is returned
    for its container to be removed after the answer (a docker rm takes ~30 ms of dockerd's time, and a
    burst of 128 closes would otherwise wait ~3 s for them). Failures of the hook are logged."""
    env = session.episode.env
    try:
        await env.close()
    except Exception:
        log.exception("error while closing session %s", session.id)
    if env.sandbox is not None:
        await env.sandbox.close_channel()
    return env.sandbox
