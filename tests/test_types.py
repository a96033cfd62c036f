"""The shared vocabulary: tito.types mirrors the proto, and tito.wire round-trips it."""

from __future__ import annotations

import asyncio

import pytest

from env_server.idempotency import OnceByKey
from tito import wire
from tito.types import Message, Role, StepResult, StepStatus, StepTiming, ToolCall, call_id
from tito.v1 import environment_pb2 as pb


def test_step_status_mirrors_the_proto_enum():
    assert {s.name: int(s) for s in StepStatus} == {
        name.removeprefix("STEP_STATUS_"): value for name, value in pb.StepStatus.items()}
    assert [s for s in StepStatus if not s.done] == [StepStatus.OK]


def test_step_result_round_trips_and_done_follows_status():
    call = ToolCall(call_id(3, 0), "run_python", '{"code": "1"}')
    for status in StepStatus:
        r = StepResult(seq=3, status=status, tool_calls=(call,), tool_messages=(Message.tool_result(call, "Out: 1"),),
                       suffix_ids=(1, 2, 3), reward=0.5 if status.done else None, truncated=True, detail="d",
                       timing=StepTiming(1.0, 2.0, 3.0, 6.0))
        p = wire.step_result_to_pb(r)
        assert p.done == (status != StepStatus.OK) and p.HasField("reward") == status.done
        assert wire.step_result_from_pb(p) == r


def test_a_status_the_client_does_not_know_ends_the_episode():
    assert wire.step_result_from_pb(pb.StepResponse(status=99)).status is StepStatus.ERROR


def test_message_dicts_round_trip():
    m = Message(role=Role.ASSISTANT, content="x", tool_calls=(ToolCall("c1", "f", '{"a": 1}'),), reasoning_content="r")
    assert Message.coerce(m.to_dict()) == m
    assert wire.message_from_pb(wire.message_to_pb(m)) == m
    with pytest.raises(ValueError):
        wire.message_from_pb(pb.Message(role="wizard"))


async def test_once_by_key_shares_one_run_and_forgets_failures():
    runs: list[str] = []

    async def work(key: str, fail: bool = False) -> str:
        runs.append(key)
        await asyncio.sleep(0.01)
        if fail:
            raise ValueError(key)
        return key.upper()

    once: OnceByKey[str, str] = OnceByKey(capacity=2)
    assert await asyncio.gather(*(once.run("a", lambda: work("a")) for _ in range(3))) == ["A"] * 3
    assert await once.run("a", lambda: work("a")) == "A" and runs == ["a"]  # replayed, not run again
    with pytest.raises(ValueError):
        await once.run("b", lambda: work("b", fail=True))
    assert once.get("b") is None  # a failure is forgotten: the next call runs afresh
    assert await once.run("b", lambda: work("b")) == "B" and runs == ["a", "b", "b"]
    await once.run("c", lambda: work("c"))
    assert once.get("a") is None and once.latest[0] == "c"  # capacity 2: the oldest is forgotten


async def test_once_by_key_outlives_a_caller_that_gives_up():
    done = asyncio.Event()

    async def work() -> int:
        await asyncio.sleep(0.05)
        done.set()
        return 7

    once: OnceByKey[int, int] = OnceByKey(capacity=1)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(once.run(1, work), 0.01)
    assert await once.run(1, work) == 7 and done.is_set()
