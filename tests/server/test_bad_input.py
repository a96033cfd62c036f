"""Every client or model mistake gets a clear status or tool message, and the server keeps serving."""

from __future__ import annotations

import json

import grpc
import pytest

from tests.sessions import open_session as open_python
from tests.sessions import rpc_error as status_of
from tests.sessions import run
from tito.v1 import environment_pb2 as pb

pytestmark = pytest.mark.docker


def test_unknown_environment(stub):
    err = status_of(lambda: stub.OpenSession(pb.OpenSessionRequest(environment="nope")))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown environment 'nope'" in err.details() and "python" in err.details()


def test_invalid_env_args(stub):
    err = status_of(lambda: open_python(stub, env_args='{"no_such_arg": 1}'))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no_such_arg" in err.details()
    err = status_of(lambda: open_python(stub, env_args="not json"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_bad_message_role(stub):
    msgs = [pb.Message(role="wizard", content="hi")]
    err = status_of(lambda: open_python(stub, messages=msgs))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "messages[0].role" in err.details()


def test_unknown_tokenizer_fingerprint(stub):
    err = status_of(lambda: open_python(stub, tokenizer_fingerprint="ab" * 32))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "RegisterTokenizer" in err.details()


def test_model_mistakes_become_tool_messages(stub):
    sid = open_python(stub)
    try:
        r = run(stub, sid, 1, name="no_such_tool", arguments="{}")
        assert r.status == pb.STEP_STATUS_OK and not r.done
        assert "unknown tool 'no_such_tool'" in r.tool_messages[0].content
        assert "run_python" in r.tool_messages[0].content

        r = run(stub, sid, 2, arguments='{"code": "1+1"')  # truncated JSON
        assert "not valid JSON" in r.tool_messages[0].content

        r = run(stub, sid, 3, arguments='{"source": "1+1"}')  # wrong field name
        assert "invalid arguments" in r.tool_messages[0].content and "code" in r.tool_messages[0].content

        r = run(stub, sid, 4, arguments='{"code": 42}')  # code that is not a string
        assert "invalid arguments" in r.tool_messages[0].content and "string" in r.tool_messages[0].content

        r = run(stub, sid, 5, arguments='["print(1)"]')
        assert "must be a JSON object" in r.tool_messages[0].content

        # The session is still usable after all that.
        r = run(stub, sid, 6, "6 * 7")
        assert r.tool_messages[0].content == "Out: 42"
        assert r.tool_messages[0].tool_call_id == "c6" and r.tool_messages[0].name == "run_python"
    finally:
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))


def test_unknown_and_closed_session(stub):
    err = status_of(lambda: run(stub, "does-not-exist", 1, "1"))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown session" in err.details()

    sid = open_python(stub)
    assert stub.CloseSession(pb.CloseSessionRequest(session_id=sid)).closed
    assert not stub.CloseSession(pb.CloseSessionRequest(session_id=sid)).closed  # idempotent
    err = status_of(lambda: run(stub, sid, 1, "1"))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "was closed (closed by the client)" in err.details()


def test_replayed_seq_returns_first_answer_without_running_twice(stub):
    sid = open_python(stub)
    try:
        run(stub, sid, 1, "counter = 0")
        first = run(stub, sid, 2, "counter += 1; counter")
        again = run(stub, sid, 2, "counter += 1; counter")  # a retry of seq 2
        assert first == again
        assert first.tool_messages[0].content == "Out: 1"
        r = run(stub, sid, 3, "counter")
        assert r.tool_messages[0].content == "Out: 1"  # ran exactly once

        err = status_of(lambda: run(stub, sid, 7, "counter"))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "expects seq 4" in err.details()
        err = status_of(lambda: run(stub, sid, 1, "counter"))  # older than the last answer
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))


def test_no_tool_call_ends_episode_with_reward(stub):
    sid = open_python(stub, env_args='{"expected_answer": "1,234"}')
    try:
        r = stub.Step(pb.StepRequest(session_id=sid, seq=1, assistant_content="The answer is 1234."))
        assert r.done and r.status == pb.STEP_STATUS_EPISODE_END and r.HasField("reward") and r.reward == 1.0
        assert len(r.suffix_ids) == 0 and len(r.tool_messages) == 0
        err = status_of(lambda: run(stub, sid, 2, "1"))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "episode" in err.details()
    finally:
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))


def test_step_after_sandbox_died(stub):
    sid = open_python(stub)
    try:
        # The REPL answers, then dies between steps.
        r = run(stub, sid, 1, "import os, threading; threading.Timer(0.2, lambda: os._exit(3)).start(); 'armed'")
        assert r.tool_messages[0].content == ("Out: 'armed'\n[still running in the background: Thread-1; what threads "
                                              "started by a call print shows in that call only]")
        import time

        time.sleep(1.0)
        r = run(stub, sid, 2, "1 + 1")
        assert r.status == pb.STEP_STATUS_SANDBOX_LOST and r.done
        assert "sandbox lost" in r.tool_messages[0].content
        assert r.tool_messages[0].content.count("lost") == 1, r.tool_messages[0].content  # reported once
        assert r.detail
        err = status_of(lambda: run(stub, sid, 3, "1"))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))


def test_completion_ids_without_tokenizer(stub):
    sid = open_python(stub)
    try:
        err = status_of(lambda: stub.Step(pb.StepRequest(session_id=sid, seq=1, completion_ids=[1, 2, 3])))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "tokenizer" in err.details()
    finally:
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))


def test_fingerprint_mismatch_on_step(stub):
    sid = open_python(stub)
    try:
        err = status_of(
            lambda: stub.Step(pb.StepRequest(session_id=sid, seq=1, tokenizer_fingerprint="f" * 64))
        )
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "mismatch" in err.details()
    finally:
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))


def test_oversized_request(stub):
    sid = open_python(stub)
    try:
        err = status_of(lambda: run(stub, sid, 1, "x = '" + "a" * (17 * 1024 * 1024) + "'"))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Under the gRPC limit but over the sandbox's code limit: the model is told.
        r = run(stub, sid, 1, "x = '" + "a" * (2 * 1024 * 1024) + "'")
        assert "too large" in r.tool_messages[0].content.lower() or "limit" in r.tool_messages[0].content.lower()
        r = run(stub, sid, 2, "'still alive'")
        assert r.tool_messages[0].content == "Out: 'still alive'"
    finally:
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))


def test_parallel_calls_run_in_order_in_one_step(stub):
    sid = open_python(stub)
    try:
        calls = [
            pb.ToolCall(id="a", name="run_python", arguments=json.dumps({"code": "v = 2"})),
            pb.ToolCall(id="b", name="run_python", arguments=json.dumps({"code": "v * 21"})),
            pb.ToolCall(id="", name="run_python", arguments=json.dumps({"code": "print('hi')"})),
        ]
        r = stub.Step(pb.StepRequest(session_id=sid, seq=1, tool_calls=calls))
        assert [m.content for m in r.tool_messages] == ["(no output)", "Out: 42", "hi"]
        assert [m.tool_call_id for m in r.tool_messages] == ["a", "b", "call_1_2"]
    finally:
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))


def test_register_tokenizer_refusals_are_clear_statuses(stub):
    from tito_assets.qwen_tokenizer import build_tokenizer_files

    err = status_of(lambda: stub.RegisterTokenizer(
        pb.RegisterTokenizerRequest(files={"tokenizer_config.json": b"{}"})))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "tokenizer.json is required" in err.details()

    phi3 = build_tokenizer_files(template="phi3")  # drops tool messages: no tool calling
    err = status_of(lambda: stub.RegisterTokenizer(pb.RegisterTokenizerRequest(files=phi3), timeout=120))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "step 'message shape'" in err.details()

    qwen = build_tokenizer_files(template="qwen2_5")
    err = status_of(lambda: stub.RegisterTokenizer(
        pb.RegisterTokenizerRequest(files=qwen, chat_template_kwargs_json="[1]")))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "JSON object" in err.details()

    # The server keeps serving: the same call with good input succeeds, idempotently.
    a = stub.RegisterTokenizer(pb.RegisterTokenizerRequest(files=qwen), timeout=120)
    b = stub.RegisterTokenizer(pb.RegisterTokenizerRequest(files=qwen), timeout=120)
    assert a.fingerprint == b.fingerprint and a.template_family == "qwen" and list(a.stop_token_ids)
