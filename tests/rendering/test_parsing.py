"""Tool-call parsing: formats, malformed calls, ids, and agreement with transformers' parse_response."""

from __future__ import annotations

import json

import pytest

from .helpers import ctx_for


def ids(ctx, text):
    return ctx.tokenizer.encode(text, add_special_tokens=False)


def test_hermes_two_calls_raw_arguments_kept():
    ctx = ctx_for("qwen3")
    text = (
        "<think>\nplan\n</think>\n\nSure.\n<tool_call>\n"
        '{"name": "run_python", "arguments": {"code": "print(1)",  "n": 1.50}}\n</tool_call>\n'
        '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call><|im_end|>'
    )
    p = ctx.parse_completion(ids(ctx, text))
    assert p.stopped and p.reasoning == "plan" and p.content == "Sure."
    assert [(c.id, c.name, c.arguments, c.error) for c in p.tool_calls] == [
        ("call_0_0", "run_python", '{"code": "print(1)",  "n": 1.50}', None),  # as written, 1.50 kept
        ("call_0_1", "lookup", "{}", None),
    ]


@pytest.mark.parametrize(
    "body, error",
    [
        ('{"name": "run_python", "arguments": {"code": "x",}}', "not valid JSON"),
        ('{"arguments": {"code": "x"}}', 'no "name"'),
        ('{"name": "run_python", "arguments": [1]}', "must be a JSON object"),
        ("run_python(code='x')", "not valid JSON"),
    ],
)
def test_hermes_malformed_calls_reported(body, error):
    ctx = ctx_for("qwen2_5")
    p = ctx.parse_completion(ids(ctx, f"<tool_call>\n{body}\n</tool_call><|im_end|>"))
    assert len(p.tool_calls) == 1 and error in p.tool_calls[0].error
    assert "<tool_call>" in p.tool_calls[0].error  # tells the model the expected format


def test_hermes_unclosed_call_and_no_call():
    ctx = ctx_for("qwen2_5")
    cut = ids(ctx, '<tool_call>\n{"name": "run_python", "arguments": {}}')  # no stop token: nothing runs it anyway
    p = ctx.parse_completion(cut, strict=True)
    assert not p.stopped and "not closed" in p.tool_calls[0].error
    p = ctx.parse_completion(cut)  # as vLLM's hermes parser reads it
    assert not p.stopped and not p.tool_calls[0].error and p.repairs
    p = ctx.parse_completion(ids(ctx, "The answer is 42.<|im_end|>"))
    assert p.tool_calls == [] and p.content == "The answer is 42."


def test_arguments_as_json_string_accepted():
    ctx = ctx_for("qwen2_5")
    p = ctx.parse_completion(ids(ctx, '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call><|im_end|>'))
    assert p.tool_calls[0].error is None and json.loads(p.tool_calls[0].arguments) == {"a": 1}


def test_call_ids_carry_the_step_seq():
    ctx = ctx_for("qwen2_5")
    p = ctx.parse_completion(ids(ctx, '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>'), seq=7)
    assert p.tool_calls[0].id == "call_7_0"


def test_llama3_json():
    ctx = ctx_for("llama3_1")
    p = ctx.parse_completion(ids(ctx, '{"name": "run_python", "parameters": {"code": "1+1"}}<|eot_id|>'))
    assert [(c.name, c.arguments, c.error) for c in p.tool_calls] == [("run_python", '{"code": "1+1"}', None)]
    p = ctx.parse_completion(ids(ctx, '<|python_tag|>{"name": "run_python", "parameters": {"code": 1}<|eom_id|>'))
    assert "not valid JSON" in p.tool_calls[0].error
    p = ctx.parse_completion(ids(ctx, "It is 2.<|eot_id|>"))
    assert p.tool_calls == [] and p.content == "It is 2."


@pytest.mark.parametrize(
    "header",
    [
        "<|start|>assistant<|channel|>commentary to=functions.run_python <|constrain|>json<|message|>",  # model order
        "<|start|>assistant to=functions.run_python<|channel|>commentary json<|message|>",  # template order
    ],
)
def test_harmony(header):
    ctx = ctx_for("gptoss")
    text = "<|channel|>analysis<|message|>Need code.<|end|>" + header + '{"code": "print(2)"}<|call|>'
    p = ctx.parse_completion(ids(ctx, text))
    assert p.stopped and p.reasoning == "Need code."
    assert [(c.name, c.arguments, c.error) for c in p.tool_calls] == [("run_python", '{"code": "print(2)"}', None)]
    bad = ctx.parse_completion(ids(ctx, "<|channel|>analysis<|message|>x<|end|>" + header + "{oops<|call|>"))
    assert "not valid JSON" in bad.tool_calls[0].error


def test_harmony_final_answer():
    ctx = ctx_for("gptoss")
    p = ctx.parse_completion(
        ids(ctx, "<|channel|>analysis<|message|>done<|end|><|start|>assistant<|channel|>final<|message|>42<|return|>")
    )
    assert p.tool_calls == [] and p.content == "42" and p.reasoning == "done"


@pytest.mark.parametrize(
    "template, schema_name, prefix",
    [
        ("qwen2_5", "qwen3_template", "<|im_start|>assistant\n"),
        ("qwen3", "qwen3_template", "<|im_start|>assistant\n"),
        ("llama3_1", "llama3_template", "<|start_header_id|>assistant<|end_header_id|>\n\n"),
        ("gptoss", "gptoss_template", "<|start|>assistant"),
    ],
)
def test_agrees_with_transformers_parse_response(template, schema_name, prefix):
    """On well-formed output our parsers agree with transformers' response-template parser
    (trl ships the templates); ours also keep the raw argument text and report malformed calls."""
    import trl.chat_template_utils as t
    from transformers.utils.chat_parsing import parse_response

    from .helpers import Turn, assistant_message, model_completion

    ctx = ctx_for(template)
    turn = Turn([("run_python", {"code": "print('hi')", "n": 3})], [], "Think first.")
    conv = [{"role": "user", "content": "go"}]
    completion = model_completion(ctx, conv, assistant_message(ctx, turn, 0))
    text = ctx.decode(completion)
    theirs = parse_response(text, getattr(t, schema_name), prefix=prefix)
    ours = ctx.parse_completion(completion)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in theirs["tool_calls"]] == [
        (c.name, json.loads(c.arguments)) for c in ours.tool_calls
    ]
    reasoning = theirs.get("reasoning_content") or theirs.get("thinking")
    if reasoning is not None:
        assert ours.reasoning == reasoning
