"""How a client reaches a server: TLS files, a bearer token, and the channel made from them.

    tls = TlsOptions(ca_file="ca.pem")                                  # TLS, server checked against ca.pem
    tls = TlsOptions(ca_file="ca.pem", cert_file="client.pem", key_file="client.key")   # mTLS
    AsyncTitoClient("tito.example:50051", tls=tls, token="...")         # + `authorization: Bearer ...`
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from tito.channel_options import bearer_metadata, client_options


@dataclass(frozen=True)
class TlsOptions:
    """TLS to the server. Every file is PEM; none is needed for a server whose certificate a public CA
    signed (the system's roots are used when `ca_file` is None)."""

    ca_file: str | Path | None = None  # CA that signed the server's certificate
    cert_file: str | Path | None = None  # client certificate, for servers that require one (mTLS)
    key_file: str | Path | None = None  # its private key
    # The name the server's certificate must carry when the address does not (e.g. an IP address
    # resolved from a DNS name, or a host name the certificate was not made for).
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("TlsOptions: give cert_file and key_file together (the client certificate and its "
                             "key, for mTLS), or neither")

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "ca_file"),
            private_key=_read(self.key_file, "key_file"),
            certificate_chain=_read(self.cert_file, "cert_file"),
        )

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def _read(path: str | Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"TlsOptions.{what} {path} cannot be read ({e.strerror or e})") from None


def call_metadata(token: str | None, metadata: Sequence[tuple[str, str]] = ()) -> tuple[tuple[str, str], ...]:
    """The metadata sent with every call: the caller's, plus the bearer token when one is given."""
    if token is not None and (not token.strip() or any(c.isspace() for c in token.strip())):
        raise ValueError("token must be one word (the server's tokens file holds one token a line)")
    return tuple(metadata) + ((bearer_metadata(token.strip()),) if token is not None else ())


def open_channel(address: str, tls: TlsOptions | None = None,
                 credentials: grpc.ChannelCredentials | None = None) -> grpc.aio.Channel:
    """An asyncio channel: TLS from `tls` or ready-made `credentials`, else plaintext."""
    if tls is not None and credentials is not None:
        raise ValueError("give either tls=TlsOptions(...) or credentials=grpc.ssl_channel_credentials(...), not both")
    options: list[tuple[str, object]] = list(client_options())
    if tls is not None:
        return grpc.aio.secure_channel(address, tls.credentials(), options=options + tls.channel_options())
    if credentials is not None:
        return grpc.aio.secure_channel(address, credentials, options=options)
    return grpc.aio.insecure_channel(address, options=options)
