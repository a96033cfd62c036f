"""`python -m env_server.healthcheck [HOST:PORT]`: exit 0 when the server's gRPC health is SERVING.

Used by the image's HEALTHCHECK, compose and the demo script. Health needs no token. The address
defaults to $HEALTHCHECK_TARGET, else 127.0.0.1:50051.

TLS: inside the server's own container the server's settings say what to do. When TITO_TLS__CERT_FILE
is set the check connects with TLS, trusting $HEALTHCHECK_CA_FILE, else the server's certificate itself
(enough for a self-signed one). Under mTLS (TITO_TLS__CLIENT_CA_FILE) it presents
$HEALTHCHECK_CERT_FILE/$HEALTHCHECK_KEY_FILE. $HEALTHCHECK_TLS_SERVER_NAME names the certificate's host
when it does not cover 127.0.0.1. Flags override all of these.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tito.channel_options import client_options
from tito.client.connection import TlsOptions


def check(address: str, tls: TlsOptions | None = None, timeout_s: float = 4.0) -> str | None:
    """None when SERVING, else what the server (or the connection) said."""
    options = client_options() + (tls.channel_options() if tls else [])
    channel = (grpc.secure_channel(address, tls.credentials(), options=options) if tls
               else grpc.insecure_channel(address, options=options))
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError as e:
            return f"{e.code().name}: {e.details()}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return None


def tls_from(args: argparse.Namespace, env: dict[str, str]) -> TlsOptions | None:
    """The TLS options of the flags, else of the environment (the server's own settings)."""
    if args.plaintext:
        return None
    ca = args.ca_file or env.get("HEALTHCHECK_CA_FILE")
    server_tls = env.get("TITO_TLS__CERT_FILE")
    if not (ca or server_tls or args.cert_file):
        return None
    return TlsOptions(
        ca_file=ca or server_tls,
        cert_file=args.cert_file or env.get("HEALTHCHECK_CERT_FILE"),
        key_file=args.key_file or env.get("HEALTHCHECK_KEY_FILE"),
        server_name=args.tls_server_name or env.get("HEALTHCHECK_TLS_SERVER_NAME"),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m env_server.healthcheck", description=__doc__.split("\n\n")[0])
    p.add_argument("address", nargs="?", help="HOST:PORT (default $HEALTHCHECK_TARGET or 127.0.0.1:50051)")
    p.add_argument("--ca-file", help="CA of the server's certificate: connect with TLS")
    p.add_argument("--cert-file", help="client certificate (servers that require mTLS)")
    p.add_argument("--key-file", help="its private key")
    p.add_argument("--tls-server-name", help="host name the server's certificate carries")
    p.add_argument("--plaintext", action="store_true", help="no TLS even if the environment says the server has it")
    args = p.parse_args(argv)
    address = args.address or os.environ.get("HEALTHCHECK_TARGET", "127.0.0.1:50051")
    try:
        problem = check(address, tls_from(args, dict(os.environ)))
    except ValueError as e:  # unreadable or half-given TLS files
        problem = str(e)
    if problem:
        print(f"{address}: not serving: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
