"""The tito.v1.Environment servicer: the gRPC adapter in front of the engine.

Each RPC converts its request to tito's types (`tito.wire`), calls the engine, and converts
the answer back. A `RequestError` becomes its status code with its message; anything else
unexpected becomes INTERNAL, so nothing raised below escapes as a crash.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, Awaitable, Callable

import grpc

from env_server.engine import Engine
from env_server.errors import ErrorKind, RequestError
from tito import wire
from tito.v1 import environment_pb2 as pb
from tito.v1 import environment_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

_STATUS = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}


# The transport's receive limit covers tokenizer uploads (max_tokenizer_bytes); every other RPC
# keeps the smaller max_message_bytes cap, checked here.
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def _rpc(kind: str, size_checked: bool = True) -> Callable:
    """Map RequestError to its status and anything unexpected to INTERNAL, counting both."""

    def wrap(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(fn)
        async def handler(self: EnvironmentService, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                if size_checked:
                    self._check_size(kind, request)
                return await fn(self, request)
            except RequestError as e:
                self.engine.metrics.errors.labels(f"{kind}:{e.kind.value}").inc()
                await context.abort(_STATUS[e.kind], e.message)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if isinstance(e, grpc.aio.AbortError):
                    raise
                self.engine.metrics.errors.labels(f"{kind}:internal").inc()
                log.exception("%s failed", kind)
                await context.abort(grpc.StatusCode.INTERNAL, f"{kind} failed on the server: {type(e).__name__}: {e}")

        return handler

    return wrap


class EnvironmentService(pb_grpc.EnvironmentServicer):
    def __init__(self, engine: Engine, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.engine = engine
        self.max_message_bytes = max_message_bytes
        # The environments never change while the server runs: convert them once.
        self._environments = [wire.environment_to_pb(e) for e in engine.list_environments()]

    def _check_size(self, kind: str, request: Any) -> None:
        size = request.ByteSize()
        if size > self.max_message_bytes:
            raise RequestError(
                ErrorKind.RESOURCE_EXHAUSTED,
                f"the {kind} request is {size} bytes, over this server's max_message_bytes of "
                f"{self.max_message_bytes}; send less (e.g. cut the completion or the tool outputs), or raise the "
                "server setting max_message_bytes (TITO_MAX_MESSAGE_BYTES)",
            )

    @_rpc("list_environments")
    async def ListEnvironments(self, request: pb.ListEnvironmentsRequest) -> pb.ListEnvironmentsResponse:
        return pb.ListEnvironmentsResponse(environments=self._environments)

    @_rpc("register_tokenizer", size_checked=False)  # capped by max_tokenizer_bytes in the registry
    async def RegisterTokenizer(self, request: pb.RegisterTokenizerRequest) -> pb.RegisterTokenizerResponse:
        registration = await self.engine.register_tokenizer(_read(wire.register_request_from_pb, request))
        return wire.registration_to_pb(registration)

    @_rpc("open_session")
    async def OpenSession(self, request: pb.OpenSessionRequest) -> pb.OpenSessionResponse:
        return wire.opened_session_to_pb(await self.engine.open_session(_read(wire.open_request_from_pb, request)))

    @_rpc("step")
    async def Step(self, request: pb.StepRequest) -> pb.StepResponse:
        return wire.step_result_to_pb(await self.engine.step(wire.step_request_from_pb(request)))

    @_rpc("close_session")
    async def CloseSession(self, request: pb.CloseSessionRequest) -> pb.CloseSessionResponse:
        return pb.CloseSessionResponse(closed=await self.engine.close_session(request.session_id))


def _read(convert: Callable[[Any], Any], request: Any) -> Any:
    """The request in tito's types; what the client got wrong is INVALID_ARGUMENT with the reason."""
    try:
        return convert(request)
    except ValueError as e:
        raise RequestError(ErrorKind.INVALID_ARGUMENT, str(e)) from None
