"""`RecordingClient`: a client that passes every call through and keeps what the server answered.

Each session's prompt ids, its Steps (what was sent, what came back) and the sessions closed: the
trainer's warm start records its demonstrations with it, and the tests check rollouts against it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tito.client.protocol import EnvironmentClient
from tito.types import (EnvironmentInfo, OpenedSession, OpenSessionRequest, RegisterTokenizerRequest, StepRequest,
                        StepResult, TokenizerRegistration)


@dataclass(frozen=True)
class RecordedStep:
    request: StepRequest
    result: StepResult


class RecordingClient(EnvironmentClient):
    def __init__(self, inner: EnvironmentClient, *, owns_inner: bool = False) -> None:
        self.inner = inner
        self.owns_inner = owns_inner  # close() closes the inner client too
        self.prompts: dict[str, tuple[int, ...]] = {}  # session id -> prompt ids
        self.steps: dict[str, list[RecordedStep]] = {}  # session id -> its Steps, in order
        self.closed: list[str] = []

    def __str__(self) -> str:
        return str(self.inner)

    async def wait_ready(self, timeout_s: float = 120.0) -> None:
        await self.inner.wait_ready(timeout_s)

    async def list_environments(self) -> list[EnvironmentInfo]:
        return await self.inner.list_environments()

    async def register(self, request: RegisterTokenizerRequest) -> TokenizerRegistration:
        return await self.inner.register(request)

    async def open(self, request: OpenSessionRequest) -> OpenedSession:
        opened = await self.inner.open(request)
        self.prompts[opened.session_id] = opened.prompt_ids
        self.steps[opened.session_id] = []
        return opened

    async def step(self, request: StepRequest) -> StepResult:
        result = await self.inner.step(request)
        self.steps.setdefault(request.session_id, []).append(RecordedStep(request, result))
        return result

    async def close_session(self, session_id: str) -> bool:
        self.closed.append(session_id)
        return await self.inner.close_session(session_id)

    async def close(self) -> None:
        """Closes the inner client only when it was given with `owns_inner=True`."""
        if self.owns_inner:
            await self.inner.close()
