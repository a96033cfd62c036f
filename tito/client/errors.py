"""Typed errors of the tito client: the gRPC status as an enum, never a string to parse."""

from __future__ import annotations

import grpc


class TitoError(RuntimeError):
    """An environment call failed. `code` is the gRPC status; `details` the server's explanation."""

    def __init__(self, rpc: str, code: grpc.StatusCode | None, details: str) -> None:
        super().__init__(f"{rpc}: {code.name if code else 'ERROR'}: {details}")
        self.rpc = rpc
        self.code = code
        self.details = details


class NotFoundError(TitoError):
    """Unknown environment, or a session that the server does not know (closed, expired, restarted)."""


class InvalidArgumentError(TitoError):
    """The request is malformed (bad JSON, unknown role, ids outside the vocabulary, unfinished turn)."""


class FailedPreconditionError(TitoError):
    """Valid, but not now: out-of-order seq, episode over, unknown or mismatched fingerprint, template refused."""


class ResourceExhaustedError(TitoError):
    """The server is full (max sessions) or the message is over its size limit."""


class UnavailableError(TitoError):
    """The server or its sandbox pool cannot serve now (still after the client's retries)."""


class UnauthenticatedError(TitoError):
    """The server wants a bearer token the client did not send, or refused the one it sent (token=...)."""


class PermissionDeniedError(TitoError):
    """The server knows the caller but does not allow the call."""


class NotServingError(TitoError):
    """The server did not report SERVING on grpc.health.v1 in time."""


_BY_CODE: dict[grpc.StatusCode, type[TitoError]] = {
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
}


def error_from_rpc(rpc: str, e: grpc.RpcError) -> TitoError:
    code = e.code()
    return _BY_CODE.get(code, TitoError)(rpc, code, e.details() or "")
