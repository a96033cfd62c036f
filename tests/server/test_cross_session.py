"""Nothing one session's sandbox does reaches another session, through the public API only (issue 34).

An outside review saw, under gVisor, one session exhausting its pids make another session's Step fail with an RPC
error. Here, on one server under each isolation (runc, runsc, bwrap): session A runs a fork bomb bounded by its
sandbox's limits while session B steps the whole time, then a session opened afterwards works too.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from tests.harness import start_server
from tests.sessions import open_session, run
from tito.v1 import environment_pb2 as pb

# Children that stay alive: the bomb holds every pid (runc, bwrap) or grows until the memory limit ends it (runsc,
# whose Docker pids limit only bounds the runtime's own threads).
FORK_BOMB = """
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            while True:
                time.sleep(1)
        n += 1
except OSError as e:
    print('fork failed after', n, type(e).__name__)
"""


def test_a_fork_bomb_in_one_session_never_fails_another_sessions_step(isolation, tmp_path):
    srv = start_server(tmp_path, backend=isolation.backend,
                       env={**isolation.env, "TITO_POOL__TARGET_SIZE": "2", "TITO_SANDBOX__EXEC_TIMEOUT_S": "20",
                                            "TITO_SANDBOX__MEM_LIMIT": "192m"})
    stub = srv.stub()
    try:
        a, b = open_session(stub), open_session(stub)
        assert run(stub, b, 1, "x = 1; x").tool_messages[0].content == "Out: 1"
        with ThreadPoolExecutor(1) as ex:
            bomb = ex.submit(run, stub, a, 1, FORK_BOMB)
            seq, outs = 1, []
            while not bomb.done() or seq < 6:
                seq += 1
                # Any RPC error raises here and fails the test: B is never to see A's trouble.
                outs.append(run(stub, b, seq, "x += 1; x", timeout=30).tool_messages[0].content)
                time.sleep(0.2)
            bombed = bomb.result()
        assert outs == [f"Out: {i}" for i in range(2, seq + 1)], outs
        # A's own answer: the bomb was bounded (its forks refused) or its sandbox lost, as a Step answer.
        content = bombed.tool_messages[0].content
        assert "fork failed after" in content or bombed.status == pb.STEP_STATUS_SANDBOX_LOST, bombed
        # A session opened after it starts and runs as any other.
        c = open_session(stub)
        assert run(stub, c, 1, "'fresh'").tool_messages[0].content == "Out: 'fresh'"
        for sid in (a, b, c):
            stub.CloseSession(pb.CloseSessionRequest(session_id=sid))
    finally:
        srv.terminate()
