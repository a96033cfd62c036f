"""gRPC channel options that the server and its clients must agree on, defined once.

Keep-alive: the client pings an idle connection no more often than the server permits, so the
server never answers with GOAWAY "too_many_pings" (a mismatch here silently drops calls under
load). Message size: the client accepts anything the server may send.
"""

from __future__ import annotations

KEEPALIVE_TIME_MS = 30_000  # ping an idle connection every 30 s
KEEPALIVE_TIMEOUT_MS = 10_000  # and drop it if the ping is not answered within 10 s
MIN_PING_INTERVAL_MS = 10_000  # the server accepts pings this often (below KEEPALIVE_TIME_MS)
# What a client accepts and sends; the server's own cap is its max_message_bytes setting.
CLIENT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def client_options() -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", CLIENT_MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", CLIENT_MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


# Bearer-token auth (env_server/auth.py checks it; tito.client sends it).
AUTH_METADATA_KEY = "authorization"


def bearer_metadata(token: str) -> tuple[str, str]:
    return (AUTH_METADATA_KEY, f"Bearer {token}")
