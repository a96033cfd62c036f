"""Retries of a Step never run its tools twice: not after a client deadline, not when concurrent.
And a turn that did not end with a stop token is refused before any tool runs."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tests.sessions import register_qwen
from tests.sessions import run as step
from tests.sessions import session as python_session
from tito.v1 import environment_pb2 as pb

pytestmark = pytest.mark.docker


@pytest.fixture
def session(stub):
    with python_session(stub) as sid:
        step(stub, sid, 1, "counter = 0")
        yield sid


SLOW_INCREMENT = "import time; time.sleep(1.0); counter += 1; counter"


def test_retry_after_client_deadline_gets_the_first_run(stub, session):
    with pytest.raises(grpc.RpcError) as info:
        step(stub, session, 2, SLOW_INCREMENT, timeout=0.2)  # the client gives up mid-run
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The step went on on the server; the retry joins it (or gets its stored answer).
    again = step(stub, session, 2, SLOW_INCREMENT)
    assert again.tool_messages[0].content == "Out: 1"
    assert step(stub, session, 3, "counter").tool_messages[0].content == "Out: 1"


def test_concurrent_retries_share_one_run(stub, session):
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: step(stub, session, 2, SLOW_INCREMENT), range(4)))
    assert all(r == replies[0] for r in replies)
    assert replies[0].tool_messages[0].content == "Out: 1"
    assert step(stub, session, 3, "counter").tool_messages[0].content == "Out: 1"


def test_next_seq_while_a_step_runs_is_refused(stub, session):
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(step, stub, session, 2, SLOW_INCREMENT)
        time.sleep(0.3)
        with pytest.raises(grpc.RpcError) as info:
            step(stub, session, 3, "counter")
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "still running" in info.value.details()
        assert slow.result().tool_messages[0].content == "Out: 1"


def test_unfinished_turn_is_refused_before_tools_run(stub):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from tito_assets.qwen_tokenizer import build_tokenizer_files

    fp = register_qwen(stub)
    files = build_tokenizer_files(template="qwen2_5")
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(files["tokenizer.json"].decode()))
    sid = stub.OpenSession(pb.OpenSessionRequest(
        environment="python", tokenizer_fingerprint=fp, messages=[pb.Message(role="user", content="hi")])).session_id
    try:
        turn = '<tool_call>\n{"name": "run_python", "arguments": {"code": "ran = True"}}\n</tool_call>'
        ids = tok.encode(turn, add_special_tokens=False)
        with pytest.raises(grpc.RpcError) as info:
            stub.Step(pb.StepRequest(session_id=sid, seq=1, completion_ids=ids))  # no <|im_end|>
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "stop token" in info.value.details()
        # Nothing ran; the same seq with the finished turn goes through.
        finished = ids + tok.encode("<|im_end|>", add_special_tokens=False)
        r = stub.Step(pb.StepRequest(session_id=sid, seq=1, completion_ids=finished))
        assert r.status == pb.STEP_STATUS_OK and len(r.suffix_ids) > 0
        check = json.dumps({"code": "'ran' in globals()"})
        call = pb.ToolCall(id="x", name="run_python", arguments=check)
        r2 = stub.Step(pb.StepRequest(session_id=sid, seq=2, tool_calls=[call]))
        assert r2.tool_messages[0].content == "Out: True"  # ran exactly once, on the finished turn
    finally:
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))
