"""The asyncio client of one tito environment server (an `EnvironmentClient`).

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
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tito import wire
from tito.client.connection import TlsOptions, call_metadata, open_channel
from tito.client.errors import NotServingError, ResourceExhaustedError, error_from_rpc
from tito.client.protocol import EnvironmentClient
from tito.types import (EnvironmentInfo, OpenedSession, OpenSessionRequest, RegisterTokenizerRequest, StepRequest,
                        StepResult, TokenizerRegistration)
from tito.v1 import environment_pb2 as pb
from tito.v1 import environment_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

# One Step may run several tool calls, each up to the sandbox timeout.
DEFAULT_DEADLINE_S = 600.0


class AsyncTitoClient(EnvironmentClient):
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

    def __str__(self) -> str:
        return self.address

    async def close(self) -> None:
        await self.channel.close()

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

    async def register(self, request: RegisterTokenizerRequest) -> TokenizerRegistration:
        message = wire.register_request_to_pb(request)
        try:
            return wire.registration_from_pb(await self._call("RegisterTokenizer", message))
        except ResourceExhaustedError as e:
            if "larger than max" not in e.details:
                raise
            # gRPC's own refusal names bytes only: say which server setting sets them.
            raise ResourceExhaustedError("RegisterTokenizer", e.code, (
                f"the upload is {message.ByteSize()} bytes, more than this server takes in one message "
                f"({e.details}); a server takes tokenizer files up to its max_tokenizer_bytes "
                "(TITO_MAX_TOKENIZER_BYTES, default 128 MiB): raise it on the server, or upload only "
                "tokenizer.json, tokenizer_config.json and the chat template")) from None

    async def open(self, request: OpenSessionRequest) -> OpenedSession:
        return wire.opened_session_from_pb(await self._call("OpenSession", wire.open_request_to_pb(request)))

    async def step(self, request: StepRequest) -> StepResult:
        return wire.step_result_from_pb(await self._call("Step", wire.step_request_to_pb(request)))

    async def close_session(self, session_id: str) -> bool:
        resp = await self._call("CloseSession", pb.CloseSessionRequest(session_id=session_id))
        return resp.closed
