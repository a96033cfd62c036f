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
