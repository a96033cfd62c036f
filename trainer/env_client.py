"""Async client for the tito.v1.Environment gRPC service, plus the interface the rollout loop uses.

The rollout loop only sees `EnvClient` (open_session / step / close_session) and `EnvError`, so
property tests can drive it with an in-process environment; the real one is `GrpcEnvClient`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from tito.v1 import environment_pb2 as pb
from tito.v1 import environment_pb2_grpc as pb_grpc

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


@dataclass
class OpenedSession:
    session_id: str
    prompt_ids: list[int]
    tools: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class StepOutcome:
    suffix_ids: list[int]
    done: bool
    reward: float | None
    truncated: bool  # the env cut some tool output
    status: str  # StepStatus name without prefix: OK, EPISODE_END, SANDBOX_LOST, SUFFIX_OVERFLOW
    num_tool_calls: int
    tool_messages: list[dict[str, str]] = field(default_factory=list)
    detail: str = ""
    tools_ms: float = 0.0


class EnvClient(Protocol):
    async def open_session(self, environment: str, messages: list[dict[str, Any]],
                           env_args: dict[str, Any] | None) -> OpenedSession: ...

    async def step(self, session_id: str, seq: int, completion_ids: list[int],
                   max_suffix_tokens: int) -> StepOutcome: ...

    async def close_session(self, session_id: str) -> None: ...


@dataclass
class TokenizerRegistration:
    fingerprint: str
    stop_token_ids: list[int]
    template_family: str
    renderer_version: str


def _message_pb(m: dict[str, Any]) -> pb.Message:
    return pb.Message(
        role=m["role"], content=m.get("content", "") or "", name=m.get("name", "") or "",
        tool_call_id=m.get("tool_call_id", "") or "",
    )


def _status_name(status: int) -> str:
    return pb.StepStatus.Name(status).removeprefix("STEP_STATUS_")


class GrpcEnvClient:
    """One channel to an env server. Transient failures are retried with backoff; anything else
    raises EnvError at once (the caller aborts that rollout, never the batch)."""

    def __init__(self, address: str, *, rpc_timeout_s: float = 600.0, retries: int = 4,
                 backoff_s: float = 0.25) -> None:
        self.address = address
        self.rpc_timeout_s = rpc_timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        # Keepalive settings stay within grpc defaults the server accepts (pings no more often
        # than every 30 s, never without calls) so the server never sends GOAWAY "too_many_pings".
        self.channel = grpc.aio.insecure_channel(
            address,
            options=[
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.keepalive_time_ms", 60_000),
                ("grpc.keepalive_permit_without_calls", 0),
            ],
        )
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

    async def _call(self, rpc: str, fn, request, *, retry: bool):
        attempt = 0
        while True:
            try:
                return await fn(request, timeout=self.rpc_timeout_s)
            except grpc.aio.AioRpcError as e:
                code = e.code()
                if retry and code in TRANSIENT and attempt < self.retries:
                    attempt += 1
                    await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
                    log.info("%s: %s, retry %d/%d", rpc, code.name, attempt, self.retries)
                    continue
                raise EnvError(rpc, f"{code.name}: {e.details()}", code) from None

    async def list_environments(self) -> list[pb.EnvironmentSpec]:
        resp = await self._call("ListEnvironments", self.stub.ListEnvironments,
                                pb.ListEnvironmentsRequest(), retry=True)
        return list(resp.environments)

    async def register_tokenizer(self, files: dict[str, bytes],
                                 chat_template_kwargs: dict[str, Any] | None = None
                                 ) -> TokenizerRegistration:
        req = pb.RegisterTokenizerRequest(
            files=files, chat_template_kwargs_json=json.dumps(chat_template_kwargs or {}))
        # Idempotent by content on the server: safe to retry.
        resp = await self._call("RegisterTokenizer", self.stub.RegisterTokenizer, req, retry=True)
        return TokenizerRegistration(
            fingerprint=resp.fingerprint, stop_token_ids=list(resp.stop_token_ids),
            template_family=resp.template_family, renderer_version=resp.renderer_version,
        )

    def bind(self, fingerprint: str) -> BoundEnvClient:
        return BoundEnvClient(self, fingerprint)


class BoundEnvClient:
    """The EnvClient the rollout loop uses: a GrpcEnvClient plus the registered fingerprint."""

    def __init__(self, client: GrpcEnvClient, fingerprint: str) -> None:
        self.client = client
        self.fingerprint = fingerprint

    async def open_session(self, environment: str, messages: list[dict[str, Any]],
                           env_args: dict[str, Any] | None) -> OpenedSession:
        req = pb.OpenSessionRequest(
            environment=environment, tokenizer_fingerprint=self.fingerprint,
            messages=[_message_pb(m) for m in messages],
            env_args=json.dumps(env_args) if env_args else "",
            # A retried OpenSession with the same key returns the same session, not a second one.
            client_request_id=uuid.uuid4().hex,
        )
        resp = await self.client._call("OpenSession", self.client.stub.OpenSession, req, retry=True)
        if not resp.prompt_ids:
            raise EnvError("OpenSession", "server returned no prompt_ids (fingerprint not applied?)")
        tools = [{"name": t.name, "description": t.description} for t in resp.tools]
        return OpenedSession(resp.session_id, list(resp.prompt_ids), tools)

    async def step(self, session_id: str, seq: int, completion_ids: list[int],
                   max_suffix_tokens: int) -> StepOutcome:
        if max_suffix_tokens < 1:
            # 0 means "no limit" on the wire; never send it by accident.
            raise ValueError(f"max_suffix_tokens must be >= 1, got {max_suffix_tokens}")
        req = pb.StepRequest(session_id=session_id, seq=seq, completion_ids=completion_ids,
                             max_suffix_tokens=max_suffix_tokens,
                             # The server refuses a session rendered for another tokenizer.
                             tokenizer_fingerprint=self.fingerprint)
        resp = await self.client._call("Step", self.client.stub.Step, req, retry=True)
        return StepOutcome(
            suffix_ids=list(resp.suffix_ids),
            done=resp.done,
            reward=resp.reward if resp.HasField("reward") else None,
            truncated=resp.truncated,
            status=_status_name(resp.status),
            num_tool_calls=len(resp.tool_calls),
            tool_messages=[{"role": m.role, "name": m.name, "content": m.content}
                           for m in resp.tool_messages],
            detail=resp.detail,
            tools_ms=resp.timing.tools_ms,
        )

    async def close_session(self, session_id: str) -> None:
        await self.client._call("CloseSession", self.client.stub.CloseSession,
                                pb.CloseSessionRequest(session_id=session_id), retry=True)
