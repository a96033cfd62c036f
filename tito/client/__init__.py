"""The public client of a tito environment server (see `docs/client.md`).

    from tito.client import TitoClient
    with TitoClient("127.0.0.1:50051") as client:
        reg = client.register_tokenizer(tokenizer)
        with client.open_session("python", messages, fingerprint=reg.fingerprint) as session:
            result = session.step(completion_ids)

`AsyncTitoClient` has the same methods as coroutines. Every client shape (one server, several
replicas, the recorder) implements one protocol, `EnvironmentClient`; sessions keep the seq.
Results are `tito.types`; errors are `TitoError` subclasses named after their gRPC status. Over TLS and with a bearer token:
`TitoClient(address, tls=TlsOptions(ca_file=...), token=...)`. Several replicas: `ReplicaClient`
(`AsyncReplicaClient`), see `docs/scaling.md`.
"""

from tito.client.aio import AsyncTitoClient
from tito.client.connection import TlsOptions
from tito.client.errors import (FailedPreconditionError, InvalidArgumentError, NotFoundError, NotServingError,
                                PermissionDeniedError, ResourceExhaustedError, TitoError, UnauthenticatedError,
                                UnavailableError)
from tito.client.protocol import AsyncSession, EnvironmentClient
from tito.client.recording import RecordingClient
from tito.client.replicas import AsyncReplicaClient, ReplicaStatus
from tito.client.sync import ReplicaClient, Session, TitoClient
from tito.types import StepResult, StepStatus

__all__ = [
    "AsyncReplicaClient",
    "AsyncSession",
    "AsyncTitoClient",
    "EnvironmentClient",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
    "NotServingError",
    "PermissionDeniedError",
    "RecordingClient",
    "ReplicaClient",
    "ReplicaStatus",
    "ResourceExhaustedError",
    "Session",
    "StepResult",
    "StepStatus",
    "TitoClient",
    "TitoError",
    "TlsOptions",
    "UnauthenticatedError",
    "UnavailableError",
]
