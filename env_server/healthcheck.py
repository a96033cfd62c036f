"""`python -m env_server.healthcheck [HOST:PORT]`: exit 0 when the server's gRPC health is SERVING.

Used by the image's HEALTHCHECK, compose and the demo script. The address defaults to
$HEALTHCHECK_TARGET, else 127.0.0.1:50051.
"""

from __future__ import annotations

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def is_serving(address: str, timeout_s: float = 4.0) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    address = args[0] if args else os.environ.get("HEALTHCHECK_TARGET", "127.0.0.1:50051")
    return 0 if is_serving(address) else 1


if __name__ == "__main__":
    sys.exit(main())
