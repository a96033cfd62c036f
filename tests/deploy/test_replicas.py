"""Several real servers behind one client: sessions spread over the healthy replicas and stay on theirs;
a SIGKILLed replica loses only its own sessions; NOT_SERVING replicas take none; nothing is left behind."""

from __future__ import annotations

import asyncio
from collections import Counter

import docker
import pytest
from grpc_health.v1 import health_pb2

from tests.harness import containers_of, start_server
from tests.sessions import wait_until
from tito.client import AsyncReplicaClient, NotServingError, ReplicaClient, StepStatus
from tito.types import ToolCall

pytestmark = pytest.mark.docker

FAST_LOSS = {"retries": 2, "backoff_s": 0.1, "health_interval_s": 0.25}


def code(text: str) -> list[ToolCall]:
    return [ToolCall("c", "run_python", f'{{"code": "{text}"}}')]


@pytest.fixture(scope="module")
def tokenizer_dir():
    from tito_assets.qwen_tokenizer import build_tokenizer_dir

    return build_tokenizer_dir(template="qwen2_5")


@pytest.fixture(scope="module")
def steady(docker_ok, tmp_path_factory):
    """A replica that stays up for the whole module."""
    srv = start_server(tmp_path_factory.mktemp("steady"))
    yield srv
    srv.terminate()
    assert containers_of(srv.server_name) == []


def test_sessions_spread_stick_and_only_the_killed_replicas_are_lost(steady, tmp_path, tokenizer_dir):
    doomed = start_server(tmp_path)
    addresses = {steady.address: steady, doomed.address: doomed}

    async def main() -> set[str]:
        async with AsyncReplicaClient(list(addresses), **FAST_LOSS) as client:
            await client.wait_ready()
            reg = await client.register_tokenizer(tokenizer_dir)
            question = [{"role": "user", "content": "What is 6 * 7?"}]
            # Opened concurrently, the sessions still spread evenly: opens in flight count as load.
            sessions = await asyncio.gather(*(client.open_session("python", question, fingerprint=reg.fingerprint)
                                              for _ in range(4)))
            where = {s.id: client.replica_of(s.id) for s in sessions}
            assert Counter(where.values()) == {steady.address: 2, doomed.address: 2}
            assert all(s.prompt_ids for s in sessions)  # the tokenizer is on both replicas
            for i, s in enumerate(sessions):
                assert (await s.step(tool_calls=code(f"x = {i}"))).status is StepStatus.OK

            old = {c.labels["tito.instance"] for c in containers_of(doomed.server_name)}
            doomed.kill()  # SIGKILL: the replica and its connections vanish
            results = await asyncio.gather(*(s.step(tool_calls=code("x")) for s in sessions))
            for i, (s, r) in enumerate(zip(sessions, results)):
                if where[s.id] == steady.address:  # untouched: state kept, calls answered
                    assert r.status is StepStatus.OK and r.tool_messages[0].content == f"Out: {i}"
                else:
                    assert r.status is StepStatus.SANDBOX_LOST and r.done, r
                    assert doomed.address in r.detail and "lost" in r.detail
            # New sessions go to the replica that is left.
            more = [await client.open_session("python") for _ in range(2)]
            assert {client.replica_of(s.id) for s in more} == {steady.address}
            for s in sessions + more:
                await s.close()
            assert all(st.sessions == 0 for st in client.status())
            # The dead server's containers stop on their own once its attach streams close.
            wait_until(lambda: not running(doomed.server_name, old), 30, "the killed replica's containers to stop")

            # The replica comes back on its address (a restarted pod): it takes new sessions again,
            # with the tokenizer registered anew before the first one; the old sessions stay lost.
            back = start_server(tmp_path, server_name=doomed.server_name, port=int(doomed.address.rsplit(":", 1)[1]))
            try:
                await client.wait_ready()
                again = [await client.open_session("python", question, fingerprint=reg.fingerprint) for _ in range(2)]
                assert {client.replica_of(s.id) for s in again} == {steady.address, back.address}
                assert all(s.prompt_ids for s in again)
                for s in again:
                    await s.close()
                # The restart of its name swept the killed instance's containers.
                assert not [c for c in containers_of(doomed.server_name) if c.labels["tito.instance"] in old]
            finally:
                back.terminate()
            return {s.id for s in sessions + more + again}

    opened = asyncio.run(main())
    assert containers_of(doomed.server_name) == []
    wait_until(lambda: not [c for c in containers_of(steady.server_name) if c.labels.get("tito.session") in opened],
               10, "the closed sessions' containers to go")


def running(server_name: str, instances: set[str]) -> list[str]:
    rows = docker.from_env().api.containers(filters={"label": ["tito.managed=1", f"tito.server={server_name}"]})
    return [r["Id"] for r in rows if (r.get("Labels") or {}).get("tito.instance") in instances]


def test_not_serving_replicas_take_no_sessions(steady, tmp_path):
    # A server whose sandbox image is missing runs, but reports NOT_SERVING.
    broken = start_server(tmp_path, env={"TITO_SANDBOX__IMAGE": "tito-no-such-image:never"}, wait=False)
    try:
        wait_until(lambda: _health(broken) == health_pb2.HealthCheckResponse.NOT_SERVING, 60,
                   "the broken replica to answer NOT_SERVING")
        # `localhost` resolves through getaddrinfo to one replica (IPv4 preferred).
        steady_by_name = "localhost:" + steady.address.rsplit(":", 1)[1]
        with ReplicaClient([steady_by_name, broken.address], **FAST_LOSS) as client:
            assert len(client.status()) == 2
            with pytest.raises(NotServingError) as info:
                client.wait_ready(timeout_s=1)
            assert broken.address in info.value.details and "NOT_SERVING" in info.value.details
            client.wait_ready(min_ready=1)
            sessions = [client.open_session("python") for _ in range(3)]
            assert {client.replica_of(s.id) for s in sessions} == {steady.address}
            assert sessions[0].step(tool_calls=code("1 + 1")).tool_messages[0].content == "Out: 2"
            for s in sessions:
                s.close()
    finally:
        broken.terminate()


def _health(srv) -> int | None:
    try:
        return srv.health()
    except Exception:
        return None
