"""prompt_ids + completion_ids + suffix_ids == the template's own render, token for token.

Ground truth is transformers' ``apply_chat_template(..., sanitize_control_tokens=True)``:
control-token strings inside messages (a tool printing "<|im_end|>") are encoded as text.
Decision (documented in env_server/rendering/context.py): tool output is untrusted text and
must never become a turn boundary, so our suffix ids match the sanitized render; the plain
render would turn such a string into the control token itself (shown below).
"""

from __future__ import annotations


import pytest
from jinja2.exceptions import TemplateError

from tito.types import Message, Role, ToolCall

from .helpers import TEMPLATES, Turn, assistant_message, ctx_for, template_ids, walk

PY = "run_python"


def test_single_call(ctx):
    walk(ctx, [Turn([(PY, {"code": "print(1)"})], ["1\n"])])


def test_three_rounds(ctx):
    walk(
        ctx,
        [
            Turn([(PY, {"code": "x = 2"})], [""]),
            Turn([(PY, {"code": "print(x)"})], ["2\n"]),
            Turn([("lookup", {"word": "x"})], ["x: a letter"]),
        ],
    )


def test_empty_output(ctx):
    walk(ctx, [Turn([(PY, {"code": "pass"})], [""])])


@pytest.mark.parametrize("out", ["  padded  ", "\n\nlines\n\n", "\t tab\n", " ", "\n"])
def test_whitespace_output(ctx, out):
    walk(ctx, [Turn([(PY, {"code": "print()"})], [out])])


def test_non_ascii_and_emoji(ctx):
    walk(ctx, [Turn([(PY, {"code": "print('é')"})], ["naïve café — 日本語 🙂🚀 e\u0301 \u200b"])])


@pytest.mark.parametrize("template", ["qwen2_5", "qwen3", "qwen3_instruct_2507"])
def test_parallel_calls_one_group(template):
    ctx = ctx_for(template)
    w = walk(ctx, [Turn([(PY, {"code": "1"}), ("lookup", {"word": "a"})], ["1", "a: the letter"])])
    text = ctx.decode(w.suffixes[0].ids)
    # Both results in one user turn, in call order.
    assert text.count("<|im_start|>user") == 1
    assert text.index("\n1\n") < text.index("a: the letter")


def test_parallel_calls_llama3_1():
    """Llama 3.1's template raises on two calls in one assistant message, so there is no template
    render of the whole conversation to compare with. What is checked: the model's completion
    yields the first call runnable and the second answered with an error; the suffix is the two
    results as consecutive ipython turns, exactly as the template renders tool messages."""
    ctx = ctx_for("llama3_1")
    asst = assistant_message(ctx, Turn([(PY, {"code": "1"}), ("lookup", {"word": "a"})], []), 0)
    with pytest.raises(TemplateError):
        template_ids(ctx, [{"role": "user", "content": "hi"}, asst])
    completion = ctx.tokenizer.encode(
        '{"name": "run_python", "parameters": {"code": "1"}}; {"name": "lookup", "parameters": {"word": "a"}}<|eot_id|>',
        add_special_tokens=False,
    )
    parsed = ctx.parse_completion(completion)
    assert [c.name for c in parsed.tool_calls] == [PY, "lookup"]
    assert parsed.tool_calls[0].error is None and "one tool call per turn" in parsed.tool_calls[1].error.replace("1 tool", "one tool")
    calls = parsed.tool_calls
    msgs = [Message(Role.TOOL, "1"), Message(Role.TOOL, "Error: not run")]
    suffix = ctx.render_suffix(calls, msgs, None)
    assert ctx.decode(suffix.ids) == (
        '<|start_header_id|>ipython<|end_header_id|>\n\n"1"<|eot_id|>'
        '<|start_header_id|>ipython<|end_header_id|>\n\n"Error: not run"<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # Same as the template's render of one call followed by both results.
    one = assistant_message(ctx, Turn([(PY, {"code": "1"})], []), 0)
    conv = [{"role": "user", "content": "hi"}, one] + [m.to_dict() for m in suffix.tool_messages]
    assert template_ids(ctx, conv)[-len(suffix.ids) :] == suffix.ids


def test_parallel_calls_gptoss():
    """Harmony has one call per assistant message (<|call|> stops generation) and the template
    renders only tool_calls[0], naming every following result after it. With two client-parsed
    calls the suffix is still exactly the template's render of that conversation."""
    ctx = ctx_for("gptoss")
    w = walk(ctx, [Turn([(PY, {"code": "1"}), ("lookup", {"word": "a"})], ["1", "a"])])
    assert ctx.decode(w.suffixes[0].ids).count("<|start|>functions.run_python to=assistant") == 2


@pytest.mark.parametrize("template", TEMPLATES)
def test_special_token_strings_in_output_are_text(template):
    ctx = ctx_for(template)
    literals = [ctx.tokenizer.convert_ids_to_tokens(i) for i in ctx.stop_token_ids] + [
        "<|im_start|>",
        "<tool_response>",
        "</tool_call>",
        "<|start_header_id|>",
        "<|start|>",
        "<|message|>",
    ]
    out = "printed: " + " ".join(literals) + " end"
    w = walk(ctx, [Turn([(PY, {"code": "print(...)"})], [out])])
    suffix = w.suffixes[0].ids
    plain = walk(ctx, [Turn([(PY, {"code": "print(...)"})], ["printed: end"])]).suffixes[0].ids
    # No extra control token appeared: the literals were tokenized as ordinary text.
    specials = set(ctx.tokenizer.all_special_ids) | set(ctx.stop_token_ids)
    assert sorted(t for t in suffix if t in specials) == sorted(t for t in plain if t in specials)
    # The unsanitized render would have produced the control tokens themselves.
    unsanitized = ctx.tokenizer.apply_chat_template(
        w.conv, tools=None, add_generation_prompt=True, tokenize=True, return_dict=False, **ctx.chat_template_kwargs
    )
    assert sum(t in specials for t in unsanitized) > sum(t in specials for t in template_ids(ctx, w.conv))


@pytest.mark.parametrize("template", TEMPLATES)
def test_long_output_cut_by_budget(template):
    ctx = ctx_for(template)
    long = "".join(f"line {i}: {'x' * (i % 17)} ✓\n" for i in range(3000))
    budget = 200
    w = walk(ctx, [Turn([(PY, {"code": "spam()"})], [long])], budget=budget)
    s = w.suffixes[0]
    assert s.truncated and not s.overflow
    assert len(s.ids) <= budget
    assert len(s.ids) >= budget - 8  # the budget is used, not wasted
    content = s.tool_messages[0].content
    assert "tokens truncated]" in content
    assert content.startswith("line 0:") and content.rstrip().endswith("✓")
    assert s.removed_tokens > 0 and f"[{s.removed_tokens} tokens truncated]" in content
    # walk() already checked: prompt + completion + suffix == the template's render of the conversation
    # with the cut tool message, i.e. the suffix is a valid template turn.


@pytest.mark.parametrize("template", TEMPLATES)
def test_parallel_long_outputs_cut_fairly(template):
    ctx = ctx_for(template)
    calls = [ToolCall("call_0", PY, "{}"), ToolCall("call_1", PY, "{}")]
    msgs = [Message(Role.TOOL, "short"), Message(Role.TOOL, "y " * 5000)]
    s = ctx.render_suffix(calls, msgs, 150)
    assert s.truncated and len(s.ids) <= 150
    assert s.tool_messages[0].content == "short"  # short outputs stay whole
    assert "tokens truncated]" in s.tool_messages[1].content


@pytest.mark.parametrize("template", TEMPLATES)
def test_overflow_when_minimal_suffix_does_not_fit(template):
    ctx = ctx_for(template)
    calls = [ToolCall("call_0", PY, "{}")]
    s = ctx.render_suffix(calls, [Message(Role.TOOL, "z" * 1000)], 5)
    assert s.overflow and s.ids == []


def test_budget_not_needed_is_exact(ctx):
    calls = [ToolCall("call_0", PY, "{}")]
    msgs = [Message(Role.TOOL, "ok")]
    full = ctx.render_suffix(calls, msgs, None)
    same = ctx.render_suffix(calls, msgs, len(full.ids))
    assert same.ids == full.ids and not same.truncated


def test_qwen3_reasoning_kept_is_exact():
    """Qwen3 with non-empty reasoning: past thinking after the last user turn is re-rendered, so
    the template is prefix-stable through the tool loop and the ids match exactly."""
    walk(ctx_for("qwen3"), [Turn([(PY, {"code": "1"})], ["1"], "hmm"), Turn([(PY, {"code": "2"})], ["2"], "ok")])


def test_qwen3_no_thinking_quirk():
    """Qwen3 with enable_thinking=False: the generation prompt pre-fills an empty
    '<think>\\n\\n</think>\\n\\n', but the template drops empty thinking from past assistant turns,
    so it is NOT prefix-stable. The trainer keeps what the model saw; what is checked: each suffix
    is the exact tail of the template's render, and our ids equal the template's once the empty
    thinking blocks of past turns are removed."""
    ctx = ctx_for("qwen3", enable_thinking=False)
    turns = [Turn([(PY, {"code": "1"})], ["1"], ""), Turn([(PY, {"code": "2"})], ["2"], "")]
    w = walk(ctx, turns, check=False)
    empty = ctx.tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    for ours, expected in zip(w.ours_at, w.expected):
        assert ours != expected
        stripped, i = [], 0
        last = max(j for j in range(len(ours)) if ours[j : j + len(empty)] == empty)
        while i < len(ours):
            if ours[i : i + len(empty)] == empty and i != last:
                i += len(empty)
                continue
            stripped.append(ours[i])
            i += 1
        assert stripped == expected
    assert any("re-renders earlier turns" in q for q in ctx.quirks)


def test_non_canonical_completion_split():
    """A completion whose ids are not what encode(decode(ids)) gives (a word spelled byte by byte)
    is kept verbatim: the suffix starts after the stop token and joins exactly."""
    ctx = ctx_for("qwen2_5")
    tok = ctx.tokenizer
    conv = [Message(Role.USER, "hi")]
    prompt = ctx.render_prompt(conv, [])
    byte_ids = [tok.convert_tokens_to_ids(c) for c in "Hello"]  # 'H','e','l','l','o' single-byte tokens
    body = tok.encode('\n{"name": "run_python", "arguments": {"code": "1"}}\n', add_special_tokens=False)
    newline = tok.encode("\n", add_special_tokens=False)
    completion = byte_ids + newline + [tok.convert_tokens_to_ids("<tool_call>")] + body + [
        tok.convert_tokens_to_ids("</tool_call>"),
        tok.convert_tokens_to_ids("<|im_end|>"),
    ]
    assert tok.encode(tok.decode(completion), add_special_tokens=False) != completion  # non-canonical
    parsed = ctx.parse_completion(completion)
    assert parsed.content == "Hello" and parsed.tool_calls[0].name == "run_python"
    suffix = ctx.render_suffix(parsed.tool_calls, [Message(Role.TOOL, "1")], None)
    full = prompt + completion + suffix.ids
    asst = {
        "role": "assistant",
        "content": "Hello",
        "tool_calls": [{"type": "function", "function": {"name": "run_python", "arguments": {"code": "1"}}}],
    }
    tool = Message(Role.TOOL, "1")
    expected_text = tok.apply_chat_template(conv + [asst, tool], tokenize=False, add_generation_prompt=True)
    assert tok.decode(full) == expected_text
    expected = tok.apply_chat_template(
        conv + [asst, tool], add_generation_prompt=True, tokenize=True, return_dict=False, sanitize_control_tokens=True
    )
    assert expected[-len(suffix.ids) :] == suffix.ids  # the suffix joins exactly
    assert full[len(prompt) : len(prompt) + len(completion)] == completion  # completion ids untouched
    assert full != expected  # only the completion's own split differs


@pytest.mark.parametrize("template", TEMPLATES)
def test_suffix_tokenized_alone_equals_in_context(template):
    """The claim behind tokenizing the suffix alone: it starts right after a control token, so
    encode(prefix + suffix) == encode(prefix) + encode(suffix)."""
    ctx = ctx_for(template)
    calls = [ToolCall(ctx.rules.style.call_id(0, 0, PY), PY, '{"code": "1"}')]
    for out in ["x", " lead", "\n\nnl", "tail  ", "😀", "'s"]:
        group = [{"role": "tool", "content": out, "name": PY, "tool_call_id": calls[0].id}]
        text = ctx.suffix_text(calls, group)
        _, prefix, _ = ctx._call_turn(calls)
        assert ctx.encode(prefix + text) == ctx.encode(prefix) + ctx.encode(text)


def test_suffix_refuses_when_not_prefix_stable():
    from env_server.rendering import RenderingContext, SuffixRenderError
    from env_server.rendering.template import ChatTemplate

    ctx = ctx_for("qwen2_5")
    # A template that renders the last assistant turn differently from earlier ones.
    source = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and loop.last %}LAST{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    broken = RenderingContext(fingerprint="x", rules=ctx.rules, template=ChatTemplate(ctx.tokenizer, source, {}),
                              renderer_version=ctx.renderer_version)
    with pytest.raises(SuffixRenderError, match="not prefix-stable"):
        broken.render_suffix([ToolCall("call_0", PY, "{}")], [Message(Role.TOOL, "1")], None)


def test_a_template_that_writes_the_date_still_renders_suffixes_after_midnight():
    """MUSE Glimmer's template writes today's date (strftime_now) into its system turn, the start of every synthetic
    conversation a suffix is cut from; the cached start went stale when the day changed and every Step after midnight
    failed as 'not prefix-stable'. The clock is the fault here, so the test moves the template's clock (its
    strftime_now global) a day on, then back."""
    ctx = ctx_for("muse_glimmer_vllm")
    assert "strftime_now" in ctx.template.source
    calls = [ToolCall(ctx.rules.style.call_id(0, 0, PY), PY, '{"code": "1"}')]
    results = [Message.tool_result(calls[0], "42\n")]
    before = ctx.render_suffix(calls, results, None).ids
    env_globals = ctx.template._template.environment.globals
    today = env_globals["strftime_now"]
    env_globals["strftime_now"] = lambda fmt: "2099-12-31"
    try:
        assert "2099-12-31" in ctx.render_text(ctx.sanitize([{"role": "user", "content": "x"}]), None, True)
        assert ctx.render_suffix(calls, results, None).ids == before
    finally:
        env_globals["strftime_now"] = today
    assert ctx.render_suffix(calls, results, None).ids == before
