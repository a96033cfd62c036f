"""How AsyncReplicaClient reads replica health, against a real grpc.health.v1 server on loopback whose
answers the test controls: a slow answer is a busy replica, not a lost one, until it stays slow."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tito.client import AsyncReplicaClient


class ControlledHealth(health_pb2_grpc.HealthServicer):
    def __init__(self) -> None:
        self.status = health_pb2.HealthCheckResponse.SERVING
        self.delay_s = 0.0

    async def Check(self, request, context):  # noqa: N802 (gRPC's name)
        await asyncio.sleep(self.delay_s)
        return health_pb2.HealthCheckResponse(status=self.status)


async def _serve() -> tuple[grpc.aio.Server, ControlledHealth, str]:
    server = grpc.aio.server()
    health = ControlledHealth()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, health, f"127.0.0.1:{port}"


def test_slow_health_checks_keep_a_serving_replica_until_slow_checks_in_a_row():
    async def main() -> None:
        server, health, address = await _serve()
        # A long interval: the test drives the checks itself.
        client = AsyncReplicaClient([address], health_interval_s=3600, health_timeout_s=0.2, slow_checks=3)
        try:
            await client.start()
            [replica] = client.replicas.values()
            assert replica.usable

            health.delay_s = 0.5  # busy: every check now times out
            for _ in range(2):
                await client._check_all()
                assert replica.usable, replica.state  # two slow checks: still SERVING
            health.delay_s = 0.0
            await client._check_all()
            assert replica.usable and replica.slow_checks == 0  # an answer resets the count

            health.delay_s = 0.5
            for _ in range(3):
                await client._check_all()
            assert not replica.usable and replica.state.startswith("DEADLINE_EXCEEDED"), replica.state

            health.delay_s = 0.0
            await client._check_all()
            assert replica.usable  # back

            health.status = health_pb2.HealthCheckResponse.NOT_SERVING
            await client._check_all()
            assert not replica.usable and replica.state == "NOT_SERVING"  # an answer of NOT_SERVING counts at once
            health.status = health_pb2.HealthCheckResponse.SERVING
            await client._check_all()
            assert replica.usable

            await server.stop(None)
            await client._check_all()
            assert not replica.usable and replica.state.startswith("UNAVAILABLE"), replica.state  # gone: at once
        finally:
            await client.close()
            await server.stop(None)

    asyncio.run(main())


def test_slow_checks_must_be_positive():
    with pytest.raises(ValueError, match="slow_checks"):
        AsyncReplicaClient(["127.0.0.1:1"], slow_checks=0)
