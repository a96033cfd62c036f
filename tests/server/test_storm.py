"""An open storm against a real server: 128 OpenSession calls at once, a warm pool of 2. Every open succeeds
(queued for a start slot, each start timed on its own), every session runs a call, and stopping the server
leaves no sandbox behind. bench/bench_storm.py prints the figures."""

from __future__ import annotations

import asyncio

import pytest

from tests.harness import only_backend, sandboxes_of, start_server
from tito.client import AsyncTitoClient, StepStatus
from tito.types import ToolCall

STORM = 128  # bench/bench_storm.py runs 256 and 1,000 (--max-sessions auto)

# 128 container starts at once: dockerd's queue is the machine's, so it runs after the parallel run (scripts/test.sh).
pytestmark = pytest.mark.exclusive


# Docker's: its container starts are what a storm queues on (bench/bench_backends.py has bwrap's bursts).
@only_backend("docker")
def test_128_opens_at_once_all_succeed(backend, tmp_path):
    # A fixed pool (the harness's default): a pool that learned this burst would start 128 more sandboxes
    # just as the server stops; test_demand.py covers learning at a size this machine's dockerd keeps up with.
    srv = start_server(tmp_path, backend=backend, env={"TITO_POOL__TARGET_SIZE": "2"})

    async def main() -> None:
        # retries=0: an open the server refused would fail here instead of being retried quietly.
        async with AsyncTitoClient(srv.address, deadline_s=600, retries=0) as client:
            await client.wait_ready()
            sessions = await asyncio.gather(*(client.open_session("python") for _ in range(STORM)))
            assert len({s.id for s in sessions}) == STORM
            results = await asyncio.gather(*(
                s.step(tool_calls=[ToolCall("c", "run_python", f'{{"code": "{i} * 2"}}')])
                for i, s in enumerate(sessions)))
            assert [r.status for r in results] == [StepStatus.OK] * STORM
            assert [r.tool_messages[0].content for r in results] == [f"Out: {i * 2}" for i in range(STORM)]
            await asyncio.gather(*(s.close() for s in sessions))

    try:
        asyncio.run(main())
        assert "OpenSession(python) failed" not in srv.log()
    finally:
        srv.terminate()
    assert sandboxes_of(backend, srv.server_name) == []
