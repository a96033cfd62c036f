"""The one client protocol: what every shape of tito client implements, and the session that keeps the seq.

`EnvironmentClient` is implemented by `AsyncTitoClient` (one server), `AsyncReplicaClient` (several)
and `RecordingClient` (passes calls through and keeps what came back); the blocking `TitoClient`
runs any of them on a private event loop. Each implements five typed calls — `register`, `open`,
`step`, `close_session`, `list_environments` — plus `wait_ready` and `close`; what is built on
them (`register_tokenizer` with its fingerprint check, `environment`, `open_session`) is written
once, here. `AsyncSession` is the one keeper of a session's `seq`.
"""

from __future__ import annotations

import abc
import asyncio
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc

from tito.client.errors import FailedPreconditionError, NotFoundError
from tito.fingerprint import RENDERER_VERSION, compute_fingerprint
from tito.tokenizer_files import tokenizer_files
from tito.types import (EnvironmentInfo, Message, OpenedSession, OpenSessionRequest, RegisterTokenizerRequest,
                        StepRequest, StepResult, TokenizerRegistration, ToolCall, ToolSpec)


class EnvironmentClient(abc.ABC):
    """An asyncio client of the tito.v1.Environment contract (one server, several, or a wrapper)."""

    # ------------------------------------------------------------ the calls each shape implements

    @abc.abstractmethod
    async def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until the server (or enough replicas) says SERVING."""

    @abc.abstractmethod
    async def list_environments(self) -> list[EnvironmentInfo]: ...

    @abc.abstractmethod
    async def register(self, request: RegisterTokenizerRequest) -> TokenizerRegistration:
        """RegisterTokenizer with these files (see `register_tokenizer` for the checked form)."""

    @abc.abstractmethod
    async def open(self, request: OpenSessionRequest) -> OpenedSession:
        """OpenSession; retried calls with the request's client_request_id open one session."""

    @abc.abstractmethod
    async def step(self, request: StepRequest) -> StepResult:
        """One Step. Sessions (`open_session`) fill in the seq; this is the call underneath."""

    @abc.abstractmethod
    async def close_session(self, session_id: str) -> bool: ...

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection(s)."""

    async def __aenter__(self) -> EnvironmentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ built on them, once

    async def environment(self, name: str) -> EnvironmentInfo:
        """The environment of that name; NotFoundError listing what the server offers otherwise."""
        envs = {e.name: e for e in await self.list_environments()}
        if name not in envs:
            raise NotFoundError("ListEnvironments", grpc.StatusCode.NOT_FOUND,
                                f"environment {name!r} is not offered by {self}; it has {sorted(envs)}")
        return envs[name]

    async def register_tokenizer(self, tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None
                                 ) -> TokenizerRegistration:
        """Upload a tokenizer (a transformers tokenizer, a folder, or file name -> bytes) in compact form.

        Checks that the server's fingerprint is the one this client computes for the same files,
        so ids rendered by the server are ids of this very tokenizer and template.
        """
        request = RegisterTokenizerRequest(files=tokenizer_files(tokenizer), chat_template_kwargs=dict(chat_template_kwargs or {}))
        registration = await self.register(request)
        local = compute_fingerprint(dict(request.files), dict(request.chat_template_kwargs), RENDERER_VERSION)
        if registration.fingerprint != local:
            raise FailedPreconditionError("RegisterTokenizer", None, (
                f"fingerprint mismatch: server {registration.fingerprint[:16]}… (renderer "
                f"{registration.renderer_version!r}) vs this client {local[:16]}… (renderer {RENDERER_VERSION!r}); "
                "the server would render other ids than this tokenizer — upgrade the older side"))
        if not registration.stop_token_ids:
            raise FailedPreconditionError("RegisterTokenizer", None, "the server returned no stop_token_ids")
        return registration

    async def open_session(self, environment: str, messages: Iterable[Message | dict[str, Any]] = (), *,
                           fingerprint: str = "", env_args: Mapping[str, Any] | None = None) -> AsyncSession:
        """Open an episode; `prompt_ids` are rendered when a tokenizer fingerprint is given."""
        # A fresh idempotency key: a retry after a dropped answer returns the same session.
        request = OpenSessionRequest.build(environment, messages, fingerprint=fingerprint, env_args=env_args,
                                           client_request_id=uuid.uuid4().hex)
        return AsyncSession(self, await self.open(request), fingerprint)


class AsyncSession:
    """An open episode: keeps the seq, and closes itself when used as a context manager."""

    def __init__(self, client: EnvironmentClient, opened: OpenedSession, fingerprint: str) -> None:
        self.client = client
        self.opened = opened
        self.fingerprint = fingerprint
        self.seq = 0  # of the last step answered
        self.closed = False

    @property
    def id(self) -> str:
        return self.opened.session_id

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        return self.opened.prompt_ids

    @property
    def tools(self) -> tuple[ToolSpec, ...]:
        return self.opened.tools

    async def step(self, completion_ids: Sequence[int] = (), *, tool_calls: Sequence[ToolCall] = (),
                   assistant_content: str = "", max_suffix_tokens: int | None = None) -> StepResult:
        """One assistant turn: generated ids (stop token included), or tool calls parsed by the caller.
        `max_suffix_tokens`: None sends no limit; 0 is a real budget of zero tokens."""
        # The seq advances only with an answer: after an error the same turn may be sent again,
        # and the server answers it without running its tools twice.
        seq = self.seq + 1
        result = await self.client.step(StepRequest(
            session_id=self.id, seq=seq, completion_ids=tuple(completion_ids), tool_calls=tuple(tool_calls),
            assistant_content=assistant_content, max_suffix_tokens=max_suffix_tokens,
            tokenizer_fingerprint=self.fingerprint))
        self.seq = seq
        return result

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.client.close_session(self.id)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        # Shielded: a cancelled caller still closes its session (the lease would, but later).
        await asyncio.shield(self.close())
