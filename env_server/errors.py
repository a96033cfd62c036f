"""Request errors: what a client did wrong, as a kind the gRPC adapter maps to a status code.

The engine raises these and never imports grpc; `service.py` turns each kind into its status.
"""

from __future__ import annotations

import enum


def quote(value: str, limit: int = 64) -> str:
    """A client's or model's string in a message: its repr, cut to a short prefix when long, so an
    error about a 5 MB session id is not itself 5 MB."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}… ({len(value)} characters)"


class ErrorKind(enum.Enum):
    INVALID_ARGUMENT = "invalid_argument"  # the request itself is wrong; fix it and resend
    NOT_FOUND = "not_found"  # unknown environment or session
    FAILED_PRECONDITION = "failed_precondition"  # valid, but not in this state (order, fingerprint, template)
    RESOURCE_EXHAUSTED = "resource_exhausted"  # the server is full; retry later
    UNAVAILABLE = "unavailable"  # the sandbox pool cannot serve now; retry later


class RequestError(Exception):
    """A client mistake, refused before anything ran; the message says what to do."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class SessionNotFound(RequestError):
    def __init__(self, session_id: str, closed_because: str | None) -> None:
        if closed_because:
            message = f"session {quote(session_id)} was closed ({closed_because}); open a new session"
        else:
            message = f"unknown session {quote(session_id)}; open a session with OpenSession first"
        super().__init__(ErrorKind.NOT_FOUND, message)
        self.session_id = session_id
