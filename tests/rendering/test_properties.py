"""Hypothesis: for random tool outputs (unicode, whitespace, control-token strings) the suffix
still joins token-exactly, and budget cuts always fit."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tito.types import Message, Role, ToolCall

from .helpers import Turn, ctx_for, walk

CONTROL = ["<|im_end|>", "<|im_start|>", "<tool_response>", "<|eot_id|>", "<|start_header_id|>", "<|call|>", "<|end|>", "<think>"]
outputs = st.lists(
    st.one_of(st.text(max_size=40), st.sampled_from(CONTROL), st.sampled_from(["\n", " ", "\t", "😀", "é", "'s"])),
    max_size=8,
).map("".join)

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(out=outputs, template=st.sampled_from(["qwen2_5", "qwen3_instruct_2507", "llama3_1", "gptoss"]))
def test_random_outputs_join_exactly(out, template):
    walk(ctx_for(template), [Turn([("run_python", {"code": "x"})], [out])])


@SETTINGS
@given(
    out=st.text(min_size=200, max_size=3000),
    budget=st.integers(min_value=1, max_value=400),
    template=st.sampled_from(["qwen2_5", "llama3_1", "gptoss"]),
)
def test_budget_always_respected(out, budget, template):
    ctx = ctx_for(template)
    s = ctx.render_suffix([ToolCall("call_0", "run_python", "{}")], [Message(Role.TOOL, out)], budget)
    if s.overflow:
        assert s.ids == []
    else:
        assert len(s.ids) <= budget


_PIECES = ["<|im_end|>", "<|im_start|>", "<tool_call>", "\U000f0000", "\U000f0001", "a", " ", "\n", "<|", "|>", "ü"]
_TEXT = st.lists(st.sampled_from(_PIECES), max_size=8).map("".join)
_DATA = st.recursive(_TEXT | st.integers() | st.none() | st.booleans(),
                     lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
                     | st.dictionaries(_TEXT, inner, max_size=3), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(data=_DATA)
def test_sanitize_marks_exactly_as_transformers_does(data):
    """ChatTemplate.sanitize walks the data itself to skip text without control tokens or markers; every value and
    type must be what transformers' mark_control_tokens gives (the markers, U+F0000 and U+F0001, are among the pieces)."""
    from transformers.utils.chat_template_utils import _CONTROL_TOKEN_END, _CONTROL_TOKEN_START, mark_control_tokens

    assert {_CONTROL_TOKEN_START, _CONTROL_TOKEN_END} == {"\U000f0000", "\U000f0001"}
    template = ctx_for("qwen2_5").template
    ours, theirs = template.sanitize(data), mark_control_tokens(data, template._control_re)
    assert ours == theirs and repr(ours) == repr(theirs)
