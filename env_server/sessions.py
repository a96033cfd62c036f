"""Session registry: one live episode per session, with leases.

A session holds its environment instance (and through it, its sandbox), the
renderer it was opened with, and the last Step answer so that a retried Step
with the same seq gets the same answer without running anything twice.
Leases: an idle TTL (refreshed by every call) and a hard TTL (from opening);
a reaper closes expired sessions, so a client that dies leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterator

from env_server.environments.base import Environment

if TYPE_CHECKING:
    from env_server.rendering import RenderingContext

log = logging.getLogger(__name__)


class SessionNotFound(KeyError):
    def __init__(self, session_id: str, reason: str | None) -> None:
        self.session_id = session_id
        self.reason = reason
        super().__init__(session_id)

    def __str__(self) -> str:
        if self.reason:
            return f"session {self.session_id!r} was closed ({self.reason}); open a new session"
        return f"unknown session {self.session_id!r}; open a session with OpenSession first"


@dataclass
class InFlightStep:
    seq: int
    task: asyncio.Task


@dataclass
class Session:
    id: str
    env_name: str
    env: Environment
    renderer: RenderingContext | None
    idle_ttl_s: float
    hard_ttl_s: float
    opened_at: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    # The step now running, if any; steps of one session run one at a time (the sandbox is stateful).
    inflight: InFlightStep | None = None
    last_seq: int = 0
    last_response: Any = None  # the StepResponse answered for last_seq
    done: bool = False
    tool_calls_made: int = 0

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def expiry_reason(self, now: float) -> str | None:
        if now - self.opened_at >= self.hard_ttl_s:
            return "hard TTL expired"
        if now - self.last_used >= self.idle_ttl_s and self.inflight is None:
            return "idle TTL expired"
        return None


class SessionRegistry:
    def __init__(
        self,
        max_sessions: int,
        on_closed: Callable[[Session, str], None] | None = None,
        tombstones: int = 10_000,
    ) -> None:
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}
        self._reserved = 0  # sessions being opened (their sandbox is on its way)
        # Closed ids and why, so a late Step gets "closed (idle TTL expired)" rather than "unknown".
        self._tombstones: OrderedDict[str, str] = OrderedDict()
        self._tombstone_cap = tombstones
        self._on_closed = on_closed
        self._reaper: asyncio.Task | None = None

    def __len__(self) -> int:
        return len(self._sessions)

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
        await _teardown(session)
        if self._on_closed:
            self._on_closed(session, reason)
        return True

    async def close_all(self, reason: str) -> None:
        await asyncio.gather(*(self.close(sid, reason) for sid in list(self._sessions)))

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


async def _teardown(session: Session) -> None:
    """Environment hook first, then the sandbox; failures are logged, never raised."""
    steps: list[Callable[[], Awaitable[None]]] = [session.env.close]
    if session.env.sandbox is not None:
        steps.append(session.env.sandbox.destroy)
    for step in steps:
        try:
            await step()
        except Exception:
            log.exception("error while closing session %s", session.id)
