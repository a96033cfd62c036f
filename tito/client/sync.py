"""The blocking client: the client protocol's methods, for scripts and synchronous trainers.

It runs one `EnvironmentClient` (an `AsyncTitoClient`, or an `AsyncReplicaClient` for
`ReplicaClient`) on a private event loop in a daemon thread, so both share one implementation
(retries, errors, fingerprint check). `gather` runs several calls concurrently on that loop, e.g.
the Steps of a whole generation batch.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from tito.client.aio import AsyncTitoClient
from tito.client.protocol import AsyncSession, EnvironmentClient
from tito.client.replicas import AsyncReplicaClient, ReplicaStatus
from tito.types import EnvironmentInfo, Message, StepRequest, StepResult, TokenizerRegistration, ToolCall, ToolSpec

T = TypeVar("T")


class TitoClient:
    """Blocking client of one server; takes `AsyncTitoClient`'s arguments (tls=, token=, ...)."""

    _async_class: Callable[..., Any] = AsyncTitoClient

    def __init__(self, address: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tito-client", daemon=True)
        self._thread.start()
        # grpc.aio channels belong to the loop they are made on: make the client there.
        self.aio: EnvironmentClient = self.run(_make(self._async_class, address, kwargs))

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run one coroutine of the async client to its end."""
        return asyncio.run_coroutine_threadsafe(_as_coro(awaitable), self._loop).result()

    def gather(self, awaitables: Iterable[Awaitable[T]]) -> list[T]:
        """Run several coroutines concurrently; results in order (the first error is raised)."""
        async def all_of() -> list[T]:
            return list(await asyncio.gather(*awaitables))
        return self.run(all_of())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self.run(self.aio.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> TitoClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        self.run(self.aio.wait_ready(timeout_s))

    def list_environments(self) -> list[EnvironmentInfo]:
        return self.run(self.aio.list_environments())

    def environment(self, name: str) -> EnvironmentInfo:
        return self.run(self.aio.environment(name))

    def register_tokenizer(self, tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None
                           ) -> TokenizerRegistration:
        return self.run(self.aio.register_tokenizer(tokenizer, chat_template_kwargs))

    def open_session(self, environment: str, messages: Iterable[Message | dict[str, Any]] = (), *,
                     fingerprint: str = "", env_args: Mapping[str, Any] | None = None) -> Session:
        return Session(self, self.run(self.aio.open_session(environment, list(messages), fingerprint=fingerprint,
                                                            env_args=env_args)))

    def step(self, request: StepRequest) -> StepResult:
        return self.run(self.aio.step(request))

    def close_session(self, session_id: str) -> bool:
        return self.run(self.aio.close_session(session_id))


class Session:
    """A blocking view of an `AsyncSession` (`.aio`, for use with `TitoClient.gather`)."""

    def __init__(self, client: TitoClient, aio: AsyncSession) -> None:
        self.client = client
        self.aio = aio

    @property
    def id(self) -> str:
        return self.aio.id

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        return self.aio.prompt_ids

    @property
    def tools(self) -> tuple[ToolSpec, ...]:
        return self.aio.tools

    @property
    def seq(self) -> int:
        return self.aio.seq

    def step(self, completion_ids: Sequence[int] = (), *, tool_calls: Sequence[ToolCall] = (),
             assistant_content: str = "", max_suffix_tokens: int | None = None) -> StepResult:
        return self.client.run(self.aio.step(completion_ids, tool_calls=tool_calls,
                                             assistant_content=assistant_content, max_suffix_tokens=max_suffix_tokens))

    def close(self) -> None:
        self.client.run(self.aio.close())

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReplicaClient(TitoClient):
    """Blocking client of several replicas: `AsyncReplicaClient` on the private loop, same methods."""

    _async_class = AsyncReplicaClient
    aio: AsyncReplicaClient  # type: ignore[assignment]

    def __init__(self, addresses: str | Sequence[str], **kwargs: Any) -> None:
        super().__init__(addresses, **kwargs)
        try:
            self.run(self.aio.start())
        except BaseException:
            self.close()  # no thread left behind by a name that does not resolve
            raise

    def wait_ready(self, timeout_s: float = 120.0, min_ready: int | None = None) -> None:
        self.run(self.aio.wait_ready(timeout_s, min_ready))

    def status(self) -> list[ReplicaStatus]:
        return self.aio.status()

    def replica_of(self, session_id: str) -> str | None:
        return self.aio.replica_of(session_id)


async def _make(cls: Callable[..., T], target: Any, kwargs: dict[str, Any]) -> T:
    return cls(target, **kwargs)


async def _as_coro(awaitable: Awaitable[T]) -> T:
    return await awaitable
