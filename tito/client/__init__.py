"""The public client of a tito environment server (see `docs/client.md`).

    from tito.client import TitoClient
    with TitoClient("127.0.0.1:50051") as client:
        reg = client.register_tokenizer(tokenizer)
        with client.open_session("python", messages, fingerprint=reg.fingerprint) as session:
            result = session.step(completion_ids)

`AsyncTitoClient` has the same methods as coroutines. Results are `tito.types`; errors are
`TitoError` subclasses named after their gRPC status.
"""

from tito.client.aio import AsyncSession, AsyncTitoClient
from tito.client.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    NotServingError,
    ResourceExhaustedError,
    TitoError,
    UnavailableError,
)
from tito.client.sync import Session, TitoClient
from tito.types import StepResult, StepStatus

__all__ = [
    "AsyncSession",
    "AsyncTitoClient",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
    "NotServingError",
    "ResourceExhaustedError",
    "Session",
    "StepResult",
    "StepStatus",
    "TitoClient",
    "TitoError",
    "UnavailableError",
]
