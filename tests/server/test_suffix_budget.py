"""max_suffix_tokens over the wire: unset is no limit, 0 is a real budget of zero tokens."""

from __future__ import annotations

import json

import pytest

from tests.sessions import register_qwen, session
from tito.v1 import environment_pb2 as pb

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def fingerprint(server):
    return register_qwen(server.stub())


def _session(stub, fingerprint):
    return session(stub, tokenizer_fingerprint=fingerprint, messages=[pb.Message(role="user", content="hi")])


def _print(n_chars: int) -> list[pb.ToolCall]:
    return [pb.ToolCall(id="c", name="run_python", arguments=json.dumps({"code": f"print('x' * {n_chars})"}))]


def test_unset_budget_is_no_limit_and_zero_is_a_budget(stub, fingerprint):
    with _session(stub, fingerprint) as sid:
        unset = stub.Step(pb.StepRequest(session_id=sid, seq=1, tool_calls=_print(2000)))
        assert not unset.HasField("reward")
        assert unset.status == pb.STEP_STATUS_OK and not unset.truncated and len(unset.suffix_ids) > 200
        zero = stub.Step(pb.StepRequest(session_id=sid, seq=2, tool_calls=_print(10), max_suffix_tokens=0))
        assert zero.status == pb.STEP_STATUS_SUFFIX_OVERFLOW and zero.done and len(zero.suffix_ids) == 0
        assert "max_suffix_tokens=0" in zero.detail


def test_a_small_budget_cuts_the_tool_output(stub, fingerprint):
    with _session(stub, fingerprint) as sid:
        r = stub.Step(pb.StepRequest(session_id=sid, seq=1, tool_calls=_print(2000), max_suffix_tokens=60))
        assert r.status == pb.STEP_STATUS_OK and not r.done and r.truncated
        assert 0 < len(r.suffix_ids) <= 60
        assert "tokens truncated]" in r.tool_messages[0].content
