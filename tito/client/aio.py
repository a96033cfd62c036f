"""The asyncio client of a tito environment server.

    async with AsyncTitoClient("127.0.0.1:50051") as client:
        reg = await client.register_tokenizer(tokenizer)          # transformers tokenizer or folder
        async with await client.open_session("python", messages, fingerprint=reg.fingerprint) as s:
            result = await s.step(completion_ids)                 # tito.types.StepResult
            if result.status is StepStatus.OK:
                ids += completion_ids + list(result.suffix_ids)

Every call that is safe to repeat is retried on UNAVAILABLE (server restarting, connection
dropped): OpenSession carries an idempotency key, a Step is idempotent by its seq, and the rest
are idempotent by nature. Errors are `tito.client.errors.TitoError` subclasses.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tito import wire
from tito.client.connection import TlsOptions, call_metadata, open_channel
from tito.client.errors import (
    FailedPreconditionError,
    NotFoundError,
    NotServingError,
    ResourceExhaustedError,
    TitoError,
    error_from_rpc,
)
from tito.fingerprint import RENDERER_VERSION, compute_fingerprint
from tito.tokenizer_files import tokenizer_files
from tito.types import (
    EnvironmentInfo,
    Message,
    OpenedSession,
    StepResult,
    TokenizerRegistration,
    ToolCall,
    ToolSpec,
)
from tito.v1 import environment_pb2 as pb
from tito.v1 import environment_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")

# One Step may run several tool calls, each up to the sandbox timeout.
DEFAULT_DEADLINE_S = 600.0


class AsyncTitoClient:
    """One channel to one env server.

    `tls=TlsOptions(ca_file=..., cert_file=..., key_file=...)` connects with TLS (mTLS with a client
    certificate), `token=` sends `authorization: Bearer <token>` with every call; `credentials=` (ready-made
    gRPC channel credentials) and `metadata=` (extra call metadata) remain for anything else.
    """

    def __init__(self, address: str, *, deadline_s: float = DEFAULT_DEADLINE_S, retries: int = 4,
                 backoff_s: float = 0.25, tls: TlsOptions | None = None, token: str | None = None,
                 credentials: grpc.ChannelCredentials | None = None,
                 metadata: Sequence[tuple[str, str]] = ()) -> None:
        self.address = address
        self.deadline_s = deadline_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.metadata = call_metadata(token, metadata)
        self.channel = open_channel(address, tls, credentials)
        self.stub = pb_grpc.EnvironmentStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncTitoClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ calls

    async def _call(self, rpc: str, request: Any, *, retry: bool = True) -> Any:
        # A loop rather than grpc's declarative retry policy: with a service config one deadline
        # covers all attempts, and a long Step needs the whole deadline on each attempt.
        method: Callable[..., Awaitable[Any]] = getattr(self.stub, rpc)
        attempt = 0
        while True:
            try:
                return await method(request, timeout=self.deadline_s, metadata=self.metadata or None)
            except grpc.aio.AioRpcError as e:
                if retry and e.code() == grpc.StatusCode.UNAVAILABLE and attempt < self.retries:
                    attempt += 1
                    log.info("%s: UNAVAILABLE (%s), retry %d/%d", rpc, e.details(), attempt, self.retries)
                    await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
                    continue
                raise error_from_rpc(rpc, e) from None

    async def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until grpc.health.v1 says SERVING (renderer checked, sandbox pool ready)."""
        health = health_pb2_grpc.HealthStub(self.channel)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last = "no answer"
        while loop.time() < deadline:
            try:
                resp = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5,
                                          metadata=self.metadata or None)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            except grpc.aio.AioRpcError as e:
                last = f"{e.code().name}: {e.details()}"
            await asyncio.sleep(0.25)
        raise NotServingError("Health", None, f"env server at {self.address} not SERVING after {timeout_s} s ({last})")

    async def list_environments(self) -> list[EnvironmentInfo]:
        resp = await self._call("ListEnvironments", pb.ListEnvironmentsRequest())
        return [wire.environment_from_pb(e) for e in resp.environments]

    async def environment(self, name: str) -> EnvironmentInfo:
        envs = {e.name: e for e in await self.list_environments()}
        if name not in envs:
            raise NotFoundError("ListEnvironments", grpc.StatusCode.NOT_FOUND,
                            f"environment {name!r} is not offered by {self.address}; it has {sorted(envs)}")
        return envs[name]

    async def register_tokenizer(self, tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None
                                 ) -> TokenizerRegistration:
        """Upload a tokenizer (a transformers tokenizer, a folder, or file name -> bytes) in compact form.

        Checks that the server's fingerprint is the one this client computes for the same files,
        so ids rendered by the server are ids of this very tokenizer and template.
        """
        files = tokenizer_files(tokenizer)
        kwargs = dict(chat_template_kwargs or {})
        request = pb.RegisterTokenizerRequest(files=files, chat_template_kwargs_json=json.dumps(kwargs))
        try:
            resp = await self._call("RegisterTokenizer", request)
        except ResourceExhaustedError as e:
            if "larger than max" not in e.details:
                raise
            # gRPC's own refusal names bytes only: say which server setting sets them.
            raise ResourceExhaustedError("RegisterTokenizer", e.code, (
                f"the upload is {request.ByteSize()} bytes, more than this server takes in one message "
                f"({e.details}); a server takes tokenizer files up to its max_tokenizer_bytes "
                "(TITO_MAX_TOKENIZER_BYTES, default 128 MiB): raise it on the server, or upload only "
                "tokenizer.json, tokenizer_config.json and the chat template")) from None
        reg = wire.registration_from_pb(resp)
        local = compute_fingerprint(files, kwargs, RENDERER_VERSION)
        if reg.fingerprint != local:
            raise FailedPreconditionError("RegisterTokenizer", None, (
                f"fingerprint mismatch: server {reg.fingerprint[:16]}… (renderer {reg.renderer_version!r}) vs "
                f"this client {local[:16]}… (renderer {RENDERER_VERSION!r}); the server would render other ids "
                "than this tokenizer — upgrade the older side"))
        if not reg.stop_token_ids:
            raise FailedPreconditionError("RegisterTokenizer", None, "the server returned no stop_token_ids")
        return reg

    async def open_session(self, environment: str, messages: Iterable[Message | dict[str, Any]] = (), *,
                           fingerprint: str = "", env_args: Mapping[str, Any] | None = None) -> AsyncSession:
        """Open an episode; `prompt_ids` are rendered when a tokenizer fingerprint is given."""
        request = pb.OpenSessionRequest(
            environment=environment, tokenizer_fingerprint=fingerprint,
            messages=[wire.message_to_pb(Message.coerce(m)) for m in messages],
            env_args=json.dumps(dict(env_args)) if env_args else "",
            # A retry after a dropped answer returns the same session instead of opening a second.
            client_request_id=uuid.uuid4().hex,
        )
        opened = await self._call("OpenSession", request)
        return AsyncSession(self, wire.opened_session_from_pb(opened), fingerprint)

    async def step(self, session_id: str, seq: int, completion_ids: Sequence[int] = (), *,
                   tool_calls: Sequence[ToolCall] = (), assistant_content: str = "",
                   max_suffix_tokens: int | None = None, fingerprint: str = "") -> StepResult:
        """One assistant turn: generated ids (stop token included), or tool calls parsed by the caller."""
        request = pb.StepRequest(
            session_id=session_id, seq=seq, completion_ids=list(completion_ids),
            tool_calls=[wire.tool_call_to_pb(c) for c in tool_calls], assistant_content=assistant_content,
            tokenizer_fingerprint=fingerprint)
        if max_suffix_tokens is not None:
            request.max_suffix_tokens = max(0, max_suffix_tokens)  # unset means no limit; 0 is a budget
        return wire.step_result_from_pb(await self._call("Step", request))

    async def close_session(self, session_id: str) -> bool:
        resp = await self._call("CloseSession", pb.CloseSessionRequest(session_id=session_id))
        return resp.closed


class AsyncSession:
    """An open episode: keeps the seq, and closes itself when used as a context manager."""

    def __init__(self, client: AsyncTitoClient, opened: OpenedSession, fingerprint: str) -> None:
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
        # The seq advances only with an answer: after an error the same turn may be sent again,
        # and the server answers it without running its tools twice.
        seq = self.seq + 1
        result = await self.client.step(self.id, seq, completion_ids, tool_calls=tool_calls,
                                        assistant_content=assistant_content, max_suffix_tokens=max_suffix_tokens,
                                        fingerprint=self.fingerprint)
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
