"""Async client for the tito.v1.Environment gRPC service, plus the interface the rollout loop uses.

The rollout loop only sees `EnvClient` (open_session / step / close_session) and `EnvError`, so
property tests can drive it with an in-process environment; the real one is `BoundEnvClient`, a
`GrpcEnvClient` bound to the registered tokenizer's fingerprint. Answers are `tito.types` objects
built by `tito.wire`, the one place that converts to and from the protobuf classes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

import grpc

from tito.channel_options import client_options
from tito.types import EnvironmentInfo, Message, OpenedSession, StepResult, TokenizerRegistration
from tito.v1 import environment_pb2 as pb
from tito.v1 import environment_pb2_grpc as pb_grpc
from tito.wire import (environment_from_pb, message_to_pb, opened_session_from_pb, registration_from_pb,
                       step_result_from_pb)

log = logging.getLogger(__name__)

# Statuses after which retrying the very same request may succeed (the server is restarting,
# a connection dropped). Step is idempotent by seq on the server, so re-sending is safe.
TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE})


class EnvError(RuntimeError):
    """An environment call failed; the rollout that made it is aborted (and maybe retried)."""

    def __init__(self, rpc: str, reason: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(f"{rpc}: {reason}")
        self.rpc = rpc
        self.code = code


class EnvClient(Protocol):
    async def open_session(self, environment: str, messages: Sequence[Message | dict[str, Any]],
                           env_args: dict[str, Any] | None) -> OpenedSession: ...

    async def step(self, session_id: str, seq: int, completion_ids: Sequence[int],
                   max_suffix_tokens: int | None) -> StepResult: ...

    async def close_session(self, session_id: str) -> None: ...


class GrpcEnvClient:
    """One channel to an env server. Transient failures are retried with backoff; anything else
    raises EnvError at once (the caller aborts that rollout, never the batch)."""

    def __init__(self, address: str, *, rpc_timeout_s: float = 600.0, retries: int = 4,
                 backoff_s: float = 0.25) -> None:
        self.address = address
        self.rpc_timeout_s = rpc_timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.channel = grpc.aio.insecure_channel(address, options=client_options())
        self.stub = pb_grpc.EnvironmentStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> GrpcEnvClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until grpc.health.v1 reports SERVING (the pool and renderer are ready)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        health = health_pb2_grpc.HealthStub(self.channel)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last = "no answer"
        while loop.time() < deadline:
            try:
                resp = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            except grpc.aio.AioRpcError as e:
                last = f"{e.code().name}: {e.details()}"
            await asyncio.sleep(0.25)
        raise EnvError("Health", f"env server at {self.address} not SERVING after {timeout_s}s ({last})")

    async def _call(self, rpc: str, fn, request):
        # A loop, not grpc's declarative retry policy (a "retryPolicy" in the service config):
        # there one deadline covers all attempts, and a long Step needs the full rpc_timeout_s on
        # every attempt. Every RPC here is safe to repeat (Step by seq, OpenSession by its key).
        attempt = 0
        while True:
            try:
                return await fn(request, timeout=self.rpc_timeout_s)
            except grpc.aio.AioRpcError as e:
                code = e.code()
                if code in TRANSIENT and attempt < self.retries:
                    attempt += 1
                    await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
                    log.info("%s: %s, retry %d/%d", rpc, code.name, attempt, self.retries)
                    continue
                raise EnvError(rpc, f"{code.name}: {e.details()}", code) from None

    async def list_environments(self) -> list[EnvironmentInfo]:
        resp = await self._call("ListEnvironments", self.stub.ListEnvironments, pb.ListEnvironmentsRequest())
        return [environment_from_pb(e) for e in resp.environments]

    async def register_tokenizer(self, files: dict[str, bytes],
                                 chat_template_kwargs: dict[str, Any] | None = None
                                 ) -> TokenizerRegistration:
        req = pb.RegisterTokenizerRequest(
            files=files, chat_template_kwargs_json=json.dumps(chat_template_kwargs or {}))
        # Idempotent by content on the server: safe to retry.
        resp = await self._call("RegisterTokenizer", self.stub.RegisterTokenizer, req)
        return registration_from_pb(resp)

    def bind(self, fingerprint: str) -> BoundEnvClient:
        return BoundEnvClient(self, fingerprint)


class BoundEnvClient:
    """The EnvClient the rollout loop uses: a GrpcEnvClient plus the registered fingerprint."""

    def __init__(self, client: GrpcEnvClient, fingerprint: str) -> None:
        self.client = client
        self.fingerprint = fingerprint

    async def open_session(self, environment: str, messages: Sequence[Message | dict[str, Any]],
                           env_args: dict[str, Any] | None) -> OpenedSession:
        req = pb.OpenSessionRequest(
            environment=environment, tokenizer_fingerprint=self.fingerprint,
            messages=[message_to_pb(Message.coerce(m)) for m in messages],
            env_args=json.dumps(env_args) if env_args else "",
            # A retried OpenSession with the same key returns the same session, not a second one.
            client_request_id=uuid.uuid4().hex,
        )
        opened = opened_session_from_pb(
            await self.client._call("OpenSession", self.client.stub.OpenSession, req))
        if not opened.prompt_ids:
            raise EnvError("OpenSession", "server returned no prompt_ids (fingerprint not applied?)")
        return opened

    async def step(self, session_id: str, seq: int, completion_ids: Sequence[int],
                   max_suffix_tokens: int | None) -> StepResult:
        """max_suffix_tokens: None sends no limit; 0 is a real budget of zero tokens."""
        req = pb.StepRequest(session_id=session_id, seq=seq, completion_ids=completion_ids,
                             # The server refuses a session rendered for another tokenizer.
                             tokenizer_fingerprint=self.fingerprint)
        if max_suffix_tokens is not None:
            req.max_suffix_tokens = max_suffix_tokens
        return step_result_from_pb(await self.client._call("Step", self.client.stub.Step, req))

    async def close_session(self, session_id: str) -> None:
        await self.client._call("CloseSession", self.client.stub.CloseSession,
                                pb.CloseSessionRequest(session_id=session_id))


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
