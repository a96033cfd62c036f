"""Transport security and bearer-token auth of the env server.

- TLS: `server_credentials(config.tls)`; with `tls.client_ca_file` the server also requires a client
  certificate signed by that CA (mTLS).
- Tokens: `TokenAuthInterceptor` accepts a call only with `authorization: Bearer <token>` metadata
  naming one of the tokens of `auth.tokens_file`. grpc.health.v1 stays open, because orchestrators
  probe it without credentials and it tells nothing but SERVING or not. Reflection needs the token
  like the API does (it describes a code-running API to whoever asks); grpcurl sends it with
  `-H 'authorization: Bearer <token>'`.

Tokens are compared with `hmac.compare_digest` against every accepted token, and are never logged
or echoed in an error.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from env_server.config import ConfigError, TlsConfig
from tito.channel_options import AUTH_METADATA_KEY

log = logging.getLogger(__name__)

# Method-name prefixes served without a token.
OPEN_SERVICES = ("/grpc.health.v1.Health/",)
MIN_TOKEN_CHARS = 16
TOKEN_HINT = "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"

MISSING = (f"this server requires a bearer token: send the metadata '{AUTH_METADATA_KEY}: Bearer <token>' "
           "(tito.client: token=...; grpcurl: -H 'authorization: Bearer <token>')")
MALFORMED = (f"the '{AUTH_METADATA_KEY}' metadata must read 'Bearer <token>' (scheme Bearer, one space, "
             "then the token)")
WRONG = (f"the bearer token in the '{AUTH_METADATA_KEY}' metadata is not one this server accepts "
         "(its auth.tokens_file); check the token the client was given")


def load_tokens(path: Path) -> tuple[bytes, ...]:
    """The tokens of a tokens file: one a line, blank lines and lines starting with '#' ignored."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"auth.tokens_file {path} cannot be read ({e.strerror or e}); "
                          "check the path (TITO_AUTH__TOKENS_FILE) and that this user may read it") from None
    except UnicodeDecodeError:
        raise ConfigError(f"auth.tokens_file {path} is not UTF-8 text; it must hold one token a line") from None
    tokens = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if any(c.isspace() for c in line):
            # The line number only: the line may be a real token.
            raise ConfigError(f"auth.tokens_file {path}, line {number}: a token cannot contain spaces "
                              "(one token a line; '#' comments must be on lines of their own)")
        tokens.append(line.encode())
    if not tokens:
        raise ConfigError(f"auth.tokens_file {path} holds no token (one token a line; blank lines and '#' "
                          f"comments are ignored); {TOKEN_HINT}")
    if short := sum(len(t) < MIN_TOKEN_CHARS for t in tokens):
        log.warning("auth.tokens_file %s: %d token(s) shorter than %d characters are easy to guess; %s",
                    path, short, MIN_TOKEN_CHARS, TOKEN_HINT)
    return tuple(tokens)


def _read_pem(path: Path, setting: str, kind: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"{setting} {path} cannot be read ({e.strerror or e}); check the path and its "
                          "permissions") from None
    if b"-----BEGIN" not in data or kind.encode() not in data:
        raise ConfigError(f"{setting} {path} is not a PEM file holding a {kind} (a '-----BEGIN ...{kind}-----' "
                          "block); see docs/scaling.md for making one with openssl")
    return data


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """TLS credentials from the config's PEM files; mTLS when a client CA is set."""
    assert tls.cert_file is not None and tls.key_file is not None
    cert = _read_pem(tls.cert_file, "tls.cert_file", "CERTIFICATE")
    key = _read_pem(tls.key_file, "tls.key_file", "PRIVATE KEY")
    client_ca = _read_pem(tls.client_ca_file, "tls.client_ca_file", "CERTIFICATE") if tls.client_ca_file else None
    credentials = grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca,
                                              require_client_auth=client_ca is not None)
    _try_credentials(credentials, tls)
    return credentials


def _try_credentials(credentials: grpc.ServerCredentials, tls: TlsConfig) -> None:
    """gRPC reports a key that does not match its certificate only as "failed to bind": try the pair on
    a throwaway loopback port, where nothing else can make the bind fail, to say what is wrong."""
    probe = grpc.server(ThreadPoolExecutor(max_workers=1))
    try:
        probe.add_secure_port("127.0.0.1:0", credentials)
    except RuntimeError:
        raise ConfigError(f"tls.key_file {tls.key_file} is not the private key of tls.cert_file {tls.cert_file}, "
                          "or one of them is damaged (gRPC could not load the pair)") from None
    finally:
        probe.stop(None)


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses, with UNAUTHENTICATED, every call but health that lacks an accepted bearer token."""

    def __init__(self, tokens: Sequence[bytes]) -> None:
        if not tokens:
            raise ValueError("TokenAuthInterceptor needs at least one token")
        self._tokens = tuple(tokens)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_SERVICES):
            return handler
        problem = self.check(details.invocation_metadata or ())
        return handler if problem is None else _refusal(handler, details.method, problem)

    def check(self, metadata: Sequence[tuple[str, str | bytes]]) -> str | None:
        """None when the metadata carries an accepted token, else what is wrong (never the token)."""
        values = [v for k, v in metadata if k.lower() == AUTH_METADATA_KEY]
        if not values:
            return MISSING
        value = values[0] if isinstance(values[0], str) else values[0].decode("utf-8", "replace")
        scheme, _, token = value.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return MALFORMED
        given = token.encode()
        accepted = False
        for known in self._tokens:  # no early exit: the time taken does not say which token was close
            accepted |= hmac.compare_digest(given, known)
        return None if accepted else WRONG


def _refusal(handler: grpc.RpcMethodHandler, method: str, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that only answers UNAUTHENTICATED."""

    async def refuse(_request: object, context: grpc.aio.ServicerContext) -> None:
        log.warning("refused %s from %s: %s", method, context.peer(), message.split(":")[0])
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return make(refuse, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
