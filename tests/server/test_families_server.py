"""New families through a real server: RegisterTokenizer, then completion ids the template itself writes,
Steps in a real sandbox, and prompt + completions + suffixes equal to the template's own render.

Covers one template per new wire format (XML parameters, GLM arg_key with the overlap stop, Gemma 4's
dialect with its stop-opens-results boundary, pythonic), and DeepSeek V3, whose later rounds render otherwise.
"""

from __future__ import annotations

import json

import pytest

from env_server.rendering import TokenizerRegistry
from env_server.rendering import messages as msgs
from tito import wire
from tito.v1 import environment_pb2 as pb
from tito_assets.qwen_tokenizer import build_tokenizer_files

pytestmark = pytest.mark.docker

LOCAL = TokenizerRegistry(max_entries=8)


def _expected(ctx, conv, tools):
    """The template's own render of the whole conversation: transformers' apply_chat_template, or (a template its
    sandbox refuses: rendering/jinja_engine.py) one render through the engine tito renders it with."""
    if ctx.template.mutates:
        return ctx.render_conversation(conv, tools, add_generation_prompt=True)
    return ctx.tokenizer.apply_chat_template(conv, tools=tools, add_generation_prompt=True, tokenize=True,
                                             return_dict=False, sanitize_control_tokens=True)


def _open(stub, template: str):
    """Registers the template's tokenizer (the server's answer checked against a local registration) and
    opens a python session with one user message: (local context, conversation, opened, tool specs)."""
    files = build_tokenizer_files(template=template)
    reg = stub.RegisterTokenizer(pb.RegisterTokenizerRequest(files=files), timeout=300)
    ctx = LOCAL.register(files)
    assert (reg.fingerprint, list(reg.stop_token_ids), reg.template_family) == (
        ctx.fingerprint, ctx.stop_token_ids, ctx.family)
    conv = [{"role": "user", "content": "What is 6 times 7? Use Python."}]
    opened = stub.OpenSession(pb.OpenSessionRequest(environment="python", tokenizer_fingerprint=reg.fingerprint,
                                                    messages=[pb.Message(role="user", content=conv[0]["content"])]),
                              timeout=60)
    return ctx, conv, opened, [wire.tool_spec_from_pb(t).openai_spec() for t in opened.tools]


@pytest.mark.parametrize("template", ["qwen3_6", "glm4moe", "gemma4", "lfm2_2_5"])
def test_two_rounds_and_an_answer_are_token_exact(stub, template):
    ctx, conv, opened, tools = _open(stub, template)
    style, sid = ctx.rules.style, opened.session_id
    try:
        ours = list(opened.prompt_ids)
        assert ours == _expected(ctx, conv, tools)  # the prompt is the template's own render, with the tools
        codes = ["x = 6 * 7\nprint('it\\'s', x)", "42"]  # the second looks like a number: it must stay a string
        for seq, code in enumerate(codes, start=1):
            turn = msgs.assistant(style, [(style.call_id(seq, 0, "run_python", seq - 1), "run_python", {"code": code})],
                                  "Let me compute." if style.reasoning_field else None)
            completion = ctx.encode(ctx.completion_text(conv, turn, tools))
            r = stub.Step(pb.StepRequest(session_id=sid, seq=seq, completion_ids=completion), timeout=120)
            assert r.status == pb.STEP_STATUS_OK, r.detail
            assert [(c.name, json.loads(c.arguments)) for c in r.tool_calls] == [("run_python", {"code": code})]
            assert "Error" not in r.tool_messages[0].content, r.tool_messages[0].content
            conv = conv + [turn] + [wire.message_from_pb(m).to_dict() for m in r.tool_messages]
            ours = ours + completion + list(r.suffix_ids)
            assert ours == _expected(ctx, conv, tools), f"round {seq}: not the template's own render"
        assert "42" in r.tool_messages[0].content
        answer = ctx.encode(ctx.completion_text(conv, {"role": "assistant", "content": "It is 42."}, tools))
        r = stub.Step(pb.StepRequest(session_id=sid, seq=len(codes) + 1, completion_ids=answer), timeout=60)
        assert r.status == pb.STEP_STATUS_EPISODE_END and r.done
    finally:
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))


def test_deepseek_v3_later_rounds_get_their_own_suffix_shape(stub):
    """DeepSeek V3's template opens the tool outputs once per conversation and rewrites earlier turns once
    later ones follow: each Step's suffix is the exact tail of the template's render at that point, with
    the first round's shape at seq 1 and the later one after."""
    ctx, conv, opened, tools = _open(stub, "deepseekv3")
    style, sid = ctx.rules.style, opened.session_id
    try:
        assert list(opened.prompt_ids) == _expected(ctx, conv, tools)
        for seq, code in enumerate(["print(6 * 7)", "print(7 * 6)", "print(42)"], start=1):
            turn = msgs.assistant(style, [(style.call_id(seq, 0, "run_python", seq - 1), "run_python", {"code": code})], None)
            completion = ctx.encode(ctx.completion_text(conv, turn, tools))
            r = stub.Step(pb.StepRequest(session_id=sid, seq=seq, completion_ids=completion), timeout=120)
            assert r.status == pb.STEP_STATUS_OK, r.detail
            assert r.tool_messages[0].content.strip() == "42"
            conv = conv + [turn] + [wire.message_from_pb(m).to_dict() for m in r.tool_messages]
            expected = _expected(ctx, conv, tools)
            assert expected[len(expected) - len(r.suffix_ids):] == list(r.suffix_ids), f"round {seq}"
            opens = ctx.decode(list(r.suffix_ids)).startswith("<｜tool▁outputs▁begin｜>")
            assert opens == (seq == 1), ctx.decode(list(r.suffix_ids))
    finally:
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))


def _open_with(stub, template: str, **session):
    files = build_tokenizer_files(template=template)
    reg = stub.RegisterTokenizer(pb.RegisterTokenizerRequest(files=files), timeout=300)
    ctx = LOCAL.register(files)
    opened = stub.OpenSession(pb.OpenSessionRequest(environment="python", tokenizer_fingerprint=reg.fingerprint,
                                                    messages=[pb.Message(role="user", content="Run it.")], **session),
                              timeout=60)
    return ctx, opened.session_id


def test_parser_repairs_are_in_the_step_detail_and_strict_sessions_get_the_error(stub):
    """A Hermes call left open at the end of the output runs by default, as vLLM's hermes parser reads it, and the
    Step's detail says what was repaired; a session opened with parsing_strict gets the error message instead."""
    for strict in (None, True):
        ctx, sid = _open_with(stub, "qwen2_5", **({} if strict is None else {"parsing_strict": strict}))
        try:
            text = '<tool_call>\n{"name": "run_python", "arguments": {"code": "print(6 * 7)"}}\n<|im_end|>'
            r = stub.Step(pb.StepRequest(session_id=sid, seq=1, completion_ids=ctx.encode(text)), timeout=120)
            assert r.status == pb.STEP_STATUS_OK
            if strict:
                assert "was not closed with </tool_call>" in r.tool_messages[0].content and not r.detail
            else:
                assert r.tool_messages[0].content.strip() == "42"
                assert r.detail == ("parser repairs (read as the deployment parser reads them): call 1 (run_python): "
                                    "closed <tool_call> with </tool_call> at the end of the output")
        finally:
            stub.CloseSession(pb.CloseSessionRequest(session_id=sid))


def test_parsing_strict_is_a_server_setting(monkeypatch):
    from env_server.config import ServerConfig

    assert ServerConfig().parsing.strict is False
    monkeypatch.setenv("TITO_PARSING__STRICT", "true")
    assert ServerConfig().parsing.strict is True
