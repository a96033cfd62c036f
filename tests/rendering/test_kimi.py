"""Kimi K2: call ids in Moonshot's form functions.NAME:IDX, the name read back from them, every template version."""

from __future__ import annotations

import json

import pytest

from tito.types import Message, ToolCall

from .helpers import TOOLS, ctx_for, template_ids

KIMI = ("kimi_k2", "kimi_k2_ids", "kimi_k2_instruct", "kimi_k2_thinking")


def _completion(ctx, calls: list[tuple[str, str, dict]]) -> list[int]:
    """A call turn as a Kimi model writes it: section, then per call its id and its JSON arguments."""
    body = "".join(f"<|tool_call_begin|>{i}<|tool_call_argument_begin|>{json.dumps(a)}<|tool_call_end|>"
                   for i, _, a in calls)
    return ctx.encode(f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|><|im_end|>")


@pytest.mark.parametrize("template", KIMI)
def test_every_kimi_template_is_accepted_as_kimi(template):
    ctx = ctx_for(template)
    assert (ctx.rules.wire, ctx.rules.boundary) == ("kimi", "<|im_end|>")


def test_the_id_only_template_gets_ids_in_moonshots_form():
    style = ctx_for("kimi_k2_ids").rules.style
    assert style.ids == "kimi"
    assert style.call_id(4, 1, "run_python", calls_before=5) == "functions.run_python:6"


def test_the_name_is_read_back_from_the_id_the_model_wrote_and_the_result_answers_it():
    ctx = ctx_for("kimi_k2_ids")
    parsed = ctx.parse_completion(_completion(ctx, [("functions.run_python:3", "", {"code": "1"}),
                                                    ("functions.lookup:4", "", {"word": "a"})]),
                                  seq=2, tools=TOOLS, calls_before=3)
    assert [(c.id, c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("functions.run_python:3", "run_python", {"code": "1"}), ("functions.lookup:4", "lookup", {"word": "a"})]
    suffix = ctx.decode(ctx.render_suffix(parsed.tool_calls, [Message.tool_result(c, "out") for c in parsed.tool_calls],
                                          None, calls_before=3).ids)
    assert suffix.startswith("<|im_system|>tool<|im_middle|>## Return of functions.run_python:3\nout<|im_end|>")
    assert "## Return of functions.lookup:4\nout" in suffix


def test_a_call_without_an_id_gets_one_in_moonshots_form_counting_the_conversations_calls():
    ctx = ctx_for("kimi_k2_ids")
    text = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.lookup:2<|tool_call_argument_begin|>{}"
            "<|tool_call_end|><|tool_call_begin|><|tool_call_argument_begin|>{}<|tool_call_end|>"
            "<|tool_calls_section_end|><|im_end|>")
    calls = ctx.parse_completion(ctx.encode(text), seq=2, tools=TOOLS, calls_before=2).tool_calls
    assert calls[0].id == "functions.lookup:2" and not calls[0].error
    assert calls[1].id == "functions.invalid_tool_call:3" and calls[1].error


@pytest.mark.parametrize("template", ["kimi_k2_instruct", "kimi_k2_thinking"])
def test_templates_that_number_calls_get_suffixes_after_as_many_calls(template):
    """llama.cpp's Instruct/Thinking copies number every call of the conversation and write that number in each
    result: the suffix of the third round says :2, the exact tail of the template's render."""
    ctx = ctx_for(template)
    assert ctx.counts_calls
    conv = [{"role": "user", "content": "go"}]
    for k in range(3):
        call = ToolCall(f"functions.lookup:{k}", "lookup", '{"word": "w"}')
        turn = {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "lookup", "arguments": {"word": "w"}}}]}
        suffix = ctx.render_suffix([call], [Message.tool_result(call, f"r{k}")], None, calls_before=k).ids
        conv = conv + [turn, {"role": "tool", "content": f"r{k}", "name": "lookup", "tool_call_id": call.id}]
        expected = template_ids(ctx, conv)
        assert expected[len(expected) - len(suffix):] == suffix
        assert f"## Return of functions.lookup:{k}\nr{k}" in ctx.decode(suffix)
