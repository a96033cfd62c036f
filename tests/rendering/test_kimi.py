"""Kimi K2: call ids in Moonshot's form functions.NAME:IDX, the name read back from them, every template version."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


# Templates that number calls: the suffix after N calls comes from a render after no earlier call (the outputs,
# exactly) and a once-per-shape render after N calls with placeholder outputs. These tests hold it to whole renders.

OUTPUTS = st.lists(st.sampled_from(list("ab \n\t\"'\\<>&|:#") + ["<|im_end|>", "## Return of functions.x:1", "ü",
                                                                  "😀", "\n\n", "<|tool_call_begin|>"]),
                   max_size=12).map("".join)


@pytest.mark.parametrize("template", ["kimi_k2_instruct", "kimi_k2_thinking"])
def test_numbered_calls_are_substituted_and_equal_whole_renders(template):
    ctx = ctx_for(template)
    assert ctx.counted_by_substitution

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(outputs=st.lists(OUTPUTS, min_size=1, max_size=3), earlier=st.integers(1, 20))
    def check(outputs, earlier):
        names = ["run_python", "lookup", "get_weather"][: len(outputs)]
        calls = [ToolCall(f"functions.{n}:{earlier + i}", n, "{}") for i, n in enumerate(names)]
        group = [{"role": "tool", "content": o, "name": n, "tool_call_id": c.id}
                 for o, n, c in zip(outputs, names, calls)]
        assert ctx._suffix_after(calls, group, earlier) == ctx._rendered_suffix(calls, group, earlier)

    check()


def test_the_numbered_suffix_joins_a_long_real_conversation_exactly():
    """Twelve rounds of one and two calls, as the server renders them (calls_before counted), against the template's
    render of the whole conversation: the round trip of a long session."""
    ctx = ctx_for("kimi_k2_instruct")
    conv, before = [{"role": "user", "content": "go"}], 0
    for k in range(12):
        names = ["lookup"] if k % 2 else ["run_python", "lookup"]
        calls = [ToolCall(f"functions.{n}:{before + i}", n, '{"word": "w"}') for i, n in enumerate(names)]
        outs = [f"  out {k}.{i}\n\n" for i in range(len(calls))]
        suffix = ctx.render_suffix(calls, [Message.tool_result(c, o) for c, o in zip(calls, outs)], None,
                                   calls_before=before).ids
        conv = conv + [{"role": "assistant", "content": "", "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": {"word": "w"}}} for c in calls]}]
        conv = conv + [{"role": "tool", "content": o, "name": c.name, "tool_call_id": c.id} for c, o in zip(calls, outs)]
        before += len(calls)
        expected = template_ids(ctx, conv)
        assert expected[len(expected) - len(suffix):] == suffix, k


def _variant(replacement: str):
    """llama.cpp's Kimi K2 Instruct template with its tool output written otherwise (a template of our own making,
    in memory only)."""
    from env_server.rendering import RenderingContext
    from env_server.rendering.template import ChatTemplate

    ctx = ctx_for("kimi_k2_instruct")
    written = "## Return of {{ tool_call_id }}\n{{render_content(message)}}"
    assert written in ctx.template.source
    source = ctx.template.source.replace(written, "## Return of {{ tool_call_id }}\n" + replacement)
    return RenderingContext(fingerprint="x", rules=ctx.rules, template=ChatTemplate(ctx.tokenizer, source, {}),
                            renderer_version=ctx.renderer_version)


def test_outputs_a_template_does_not_write_as_they_are_are_rendered_whole():
    ctx = _variant("{{ render_content(message) | trim }}")
    assert ctx.counts_calls and ctx.counted_by_substitution  # outputs without padding are written as they are
    calls = [ToolCall("functions.lookup:5", "lookup", "{}")]
    for out in ["plain", "  padded \n\n"]:
        group = [{"role": "tool", "content": out, "name": "lookup", "tool_call_id": calls[0].id}]
        assert (ctx._counted_suffix(calls, group, 5) is None) == (out != out.strip())
        assert ctx._suffix_after(calls, group, 5) == ctx._rendered_suffix(calls, group, 5)
        assert f"## Return of functions.lookup:5\n{out.strip()}<|im_end|>" in ctx._suffix_after(calls, group, 5)


def test_a_template_that_writes_outputs_otherwise_after_more_calls_is_rendered_whole():
    """The one thing substitution assumes: a template writes an output the same way whatever the number of earlier
    calls. Registration compares substituted and whole suffixes after 1 and 3 calls and turns substitution off for a
    template that trims outputs after the second call; one that changes the placeholder too (upper case) never gets
    a substituted suffix (its placeholder is not found)."""
    trims = _variant("{% if tool_call_counter.value > 2 %}{{ render_content(message) | trim }}"
                     "{% else %}{{ render_content(message) }}{% endif %}")
    assert trims.counts_calls and not trims.counted_by_substitution
    shouts = _variant("{% if tool_call_counter.value > 2 %}{{ render_content(message) | upper }}"
                      "{% else %}{{ render_content(message) }}{% endif %}")
    calls = [ToolCall("functions.lookup:5", "lookup", "{}")]
    group = [{"role": "tool", "content": "  quiet ", "name": "lookup", "tool_call_id": calls[0].id}]
    assert "## Return of functions.lookup:5\nquiet<|im_end|>" in trims._suffix_after(calls, group, 5)
    assert shouts._counted_suffix(calls, group, 5) is None
    assert "## Return of functions.lookup:5\n  QUIET <|im_end|>" in shouts._suffix_after(calls, group, 5)


def test_a_difference_registration_could_not_see_is_caught_by_the_audit_and_said(caplog):
    """A template that rewrites one word of an output after two calls passes registration (its outputs hold no such
    word). The first substituted suffix, and every AUDIT_EVERY-th after it, is compared with the whole render: the
    difference is logged as an error naming the tokenizer, the whole render is returned, and substitution stays off."""
    import logging

    from env_server.rendering.context import AUDIT_EVERY

    ctx = _variant("{% if tool_call_counter.value > 2 %}{{ render_content(message) | replace('quiet', 'loud') }}"
                   "{% else %}{{ render_content(message) }}{% endif %}")
    assert ctx.counted_by_substitution
    calls = [ToolCall("functions.lookup:5", "lookup", "{}")]
    quiet = [{"role": "tool", "content": "quiet", "name": "lookup", "tool_call_id": calls[0].id}]
    plain = [dict(quiet[0], content="calm")]
    for _ in range(AUDIT_EVERY):  # the first is audited, the rest substituted: all right, as these outputs hold no word
        assert "## Return of functions.lookup:5\ncalm<|im_end|>" in ctx._suffix_after(calls, plain, 5)
    assert ctx._counted_suffix(calls, quiet, 5) != ctx._rendered_suffix(calls, quiet, 5)  # what substitution gets wrong
    with caplog.at_level(logging.ERROR, logger="env_server.rendering.context"):
        suffix = ctx._suffix_after(calls, quiet, 5)  # the next audited one
    assert "## Return of functions.lookup:5\nloud<|im_end|>" in suffix
    assert not ctx.counted_by_substitution
    assert "rendered whole from now on" in caplog.text and ctx.fingerprint[:12] in caplog.text
    assert "## Return of functions.lookup:5\nloud<|im_end|>" in ctx._suffix_after(calls, quiet, 5)
