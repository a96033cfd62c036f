"""Hostile input: deeply nested JSON and huge strings become clear, short answers, never crashes."""

from __future__ import annotations

import grpc
import pytest

from tests.sessions import register_qwen, rpc_error, run, session
from tito.v1 import environment_pb2 as pb

pytestmark = pytest.mark.docker

DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "x" * (5 * 1024 * 1024)


def test_nested_tool_arguments_are_a_tool_message_and_the_session_lives(stub):
    with session(stub) as sid:
        r = run(stub, sid, 1, arguments='{"code": ' + DEEP + "}")
        assert r.status == pb.STEP_STATUS_OK and not r.done
        assert "nested too deeply" in r.tool_messages[0].content
        assert run(stub, sid, 2, "'alive'").tool_messages[0].content == "Out: 'alive'"


def test_nested_arguments_in_generated_ids_are_a_tool_message(stub):
    from tokenizers import Tokenizer

    from tito_assets.qwen_tokenizer import build_tokenizer_files

    tok = Tokenizer.from_str(build_tokenizer_files(template="qwen2_5")["tokenizer.json"].decode())
    fp = register_qwen(stub)
    with session(stub, tokenizer_fingerprint=fp, messages=[pb.Message(role="user", content="hi")]) as sid:
        text = '<tool_call>\n{"name": "run_python", "arguments": {"code": ' + DEEP + "}}\n</tool_call><|im_end|>"
        ids = tok.encode(text, add_special_tokens=False).ids
        r = stub.Step(pb.StepRequest(session_id=sid, seq=1, completion_ids=ids), timeout=120)
        assert r.status == pb.STEP_STATUS_OK and "nested too deeply" in r.tool_messages[0].content
        assert len(r.suffix_ids) > 0


def test_nested_env_args_and_template_kwargs_are_invalid_argument(stub):
    err = rpc_error(lambda: stub.OpenSession(pb.OpenSessionRequest(environment="python", env_args=DEEP), timeout=60))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    from tito_assets.qwen_tokenizer import build_tokenizer_files

    files = build_tokenizer_files(template="qwen2_5")
    err = rpc_error(lambda: stub.RegisterTokenizer(
        pb.RegisterTokenizerRequest(files=files, chat_template_kwargs_json=DEEP), timeout=120))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "nested too deeply" in err.details()


def test_huge_strings_are_not_echoed_back(stub):
    err = rpc_error(lambda: stub.Step(pb.StepRequest(session_id=HUGE, seq=1), timeout=60))
    assert err.code() == grpc.StatusCode.NOT_FOUND and len(err.details()) < 300
    err = rpc_error(lambda: stub.OpenSession(pb.OpenSessionRequest(environment=HUGE), timeout=60))
    assert err.code() == grpc.StatusCode.NOT_FOUND and len(err.details()) < 300 and "python" in err.details()
    with session(stub) as sid:
        r = run(stub, sid, 1, name=HUGE[:100_000], arguments="{}")
        assert "unknown tool" in r.tool_messages[0].content and len(r.tool_messages[0].content) < 300
