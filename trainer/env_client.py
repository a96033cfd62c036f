"""The environment as the rollout loop sees it: open a session, step it, close it.

`EnvClient` is the protocol, so property tests can drive the loop with an in-process fake.
`TitoEnv` is the real one: the public `tito.client.AsyncTitoClient` (retries, typed results and
errors, fingerprint check) bound to the registered tokenizer's fingerprint. Failures raise
`tito.client.TitoError`; the rollout that made the call is aborted (and maybe retried), never the batch.
`RecordingEnvClient` keeps what the server answered (warm-start demonstrations, tests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tito.client import AsyncReplicaClient, AsyncTitoClient, TitoError
from tito.types import Message, OpenedSession, StepResult, TokenizerRegistration


class EnvClient(Protocol):
    async def open_session(self, environment: str, messages: Sequence[Message | dict[str, Any]],
                           env_args: dict[str, Any] | None) -> OpenedSession: ...

    async def step(self, session_id: str, seq: int, completion_ids: Sequence[int],
                   max_suffix_tokens: int | None) -> StepResult: ...

    async def close_session(self, session_id: str) -> None: ...


class TitoEnv:
    """An `AsyncTitoClient` bound to one registered tokenizer: the EnvClient of real runs."""

    def __init__(self, client: AsyncTitoClient | AsyncReplicaClient, registration: TokenizerRegistration) -> None:
        self.client = client
        self.registration = registration

    @classmethod
    async def connect(cls, address: str | list[str], tokenizer: Any, *, environment: str | None = None,
                      chat_template_kwargs: Mapping[str, Any] | None = None, ready_timeout_s: float = 120.0,
                      **client_options: Any) -> TitoEnv:
        """Wait for SERVING, check the environment is offered, register the tokenizer (fingerprint checked).
        A list of addresses spreads sessions over replicas (`AsyncReplicaClient`, the same API)."""
        client = (AsyncReplicaClient(address, **client_options) if isinstance(address, list)
                  else AsyncTitoClient(address, **client_options))
        try:
            await client.wait_ready(ready_timeout_s)
            if environment is not None:
                await client.environment(environment)
            registration = await client.register_tokenizer(tokenizer, chat_template_kwargs)
        except BaseException:
            await client.close()
            raise
        return cls(client, registration)

    @property
    def stop_token_ids(self) -> list[int]:
        return list(self.registration.stop_token_ids)

    async def open_session(self, environment: str, messages: Sequence[Message | dict[str, Any]],
                           env_args: dict[str, Any] | None) -> OpenedSession:
        session = await self.client.open_session(environment, messages, fingerprint=self.registration.fingerprint,
                                                 env_args=env_args)
        if not session.prompt_ids:
            raise TitoError("OpenSession", None, "the server returned no prompt_ids (fingerprint not applied?)")
        return session.opened

    async def step(self, session_id: str, seq: int, completion_ids: Sequence[int],
                   max_suffix_tokens: int | None) -> StepResult:
        """max_suffix_tokens: None sends no limit; 0 is a real budget of zero tokens."""
        return await self.client.step(session_id, seq, completion_ids, max_suffix_tokens=max_suffix_tokens,
                                      fingerprint=self.registration.fingerprint)

    async def close_session(self, session_id: str) -> None:
        await self.client.close_session(session_id)

    async def close(self) -> None:
        await self.client.close()


class RecordingEnvClient:
    """An EnvClient that passes every call through and keeps what the server returned: each
    session's prompt ids and Step results, and the sessions closed. The warm start records its
    demonstrations with it; the tests check rollouts against it."""

    def __init__(self, inner: EnvClient) -> None:
        self.inner = inner
        self.prompts: dict[str, tuple[int, ...]] = {}
        self.steps: dict[str, list[StepResult]] = {}
        self.closed: list[str] = []

    async def open_session(self, environment: str, messages: Sequence[Message | dict[str, Any]],
                           env_args: dict[str, Any] | None) -> OpenedSession:
        opened = await self.inner.open_session(environment, messages, env_args)
        self.prompts[opened.session_id] = opened.prompt_ids
        self.steps[opened.session_id] = []
        return opened

    async def step(self, session_id: str, seq: int, completion_ids: Sequence[int],
                   max_suffix_tokens: int | None) -> StepResult:
        result = await self.inner.step(session_id, seq, completion_ids, max_suffix_tokens)
        self.steps[session_id].append(result)
        return result

    async def close_session(self, session_id: str) -> None:
        self.closed.append(session_id)
        await self.inner.close_session(session_id)
