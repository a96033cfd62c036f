"""Issue 35: calls that real deployments read and tito read otherwise (Kimi K2 Thinking's earlier copy, Nemotron JSON,
Apertus)."""

from __future__ import annotations

import json

from .helpers import REGISTRY, TOOLS, Turn, ctx_for, files_for, walk

# ---------------------------------------------------------------- Kimi K2 Thinking, llama.cpp before its current copy

# llama.cpp's models/templates/moonshotai-Kimi-K2-Thinking.jinja at commit 0c3c896 (3,430 characters) differs from the
# current Kimi-K2-Thinking.jinja (pinned as kimi_k2_thinking) in what registration reads in two places: it writes each
# call's id as given (`{%- set formatted_id = tool_call['id'] -%}`) instead of minting functions.NAME:IDX, and heads
# each result with the message's own tool_call_id instead of the queue of minted ids (the rest: whitespace, the
# counters those need). No published package was found shipping that copy (the llama-cpp-python sdists 0.3.17, 0.3.20
# and 0.3.25 vendor the current one; 0.3.16 predates Kimi K2 Thinking), so it is rebuilt here, in memory, from the
# pinned current copy by those two changes.
_MINTED = "{%- set formatted_id = 'functions.' + tool_call['function']['name'] + ':' + (tool_call_counter.value | string) -%}"
_QUEUED = """{%- if tool_response_queue.ids -%}
      {%- set tool_call_id = tool_response_queue.ids.pop(0) -%}
    {%- else -%}
      {%- set tool_call_id = 'functions.' + message.get('name', 'unknown') + ':' + (tool_call_counter.value | string) -%}
    {%- endif -%}"""


def _kimi_thinking_0c3c896() -> dict[str, bytes]:
    files = files_for("kimi_k2_thinking")
    source = files["chat_template.jinja"].decode()
    assert source.count(_MINTED) == 1 and source.count(_QUEUED) == 2
    source = source.replace(_MINTED, "{%- set formatted_id = tool_call['id'] -%}")
    source = source.replace(_QUEUED, "{%- set tool_call_id = message.tool_call_id -%}")
    return {**files, "chat_template.jinja": source.encode()}


def test_kimi_thinking_that_writes_ids_as_given_gets_ids_in_moonshots_form():
    """Before: refused at 'wire format' (tito's call_0_0 ids carry no name; the tool message's name in its role header
    let the shape step pass). After: the probe sees the id written where the name belongs and mints kimi ids."""
    ctx = REGISTRY.register(_kimi_thinking_0c3c896(), {})
    assert (ctx.rules.wire, ctx.rules.boundary, ctx.rules.style.ids) == ("kimi", "<|im_end|>", "kimi")
    assert ctx.rules.style.call_id(2, 0, "lookup", calls_before=3) == "functions.lookup:3"


def test_kimi_thinking_0c3c896_walks_three_rounds_exactly():
    ctx = REGISTRY.register(_kimi_thinking_0c3c896(), {})
    w = walk(ctx, [Turn([("run_python", {"code": "x = 2"})], ["4"]),
                   Turn([("run_python", {"code": "print(x)"}), ("lookup", {"word": "a"})], ["2\n", "a: x"]),
                   Turn([("get_weather", {"city": "Paris", "zip": "75001", "days": 3})], ["sunny"])])
    text = ctx.decode(w.ours)
    assert "<|tool_call_begin|>functions.lookup:2<|tool_call_argument_begin|>" in text
    assert "## Return of functions.get_weather:3\nsunny" in text


# ---------------------------------------------------------------- Nemotron JSON (vLLM's example template)

# vLLM's examples/tool_chat_template_nemotron_json.jinja (vllm-project/vllm 4b6abc6) is in none of the vllm sdists
# (0.8.5, 0.9.2, 0.10.1.1, 0.11.0, 0.20.0, 0.33.0), so it cannot be pinned: tito_assets/templates/nemotron_json.jinja
# is that shape written for tito from its facts (a last assistant message is a prefill whose calls are dropped).


def _nemotron_json():
    return REGISTRY.register(files_for("nemotron_json"), {})


def test_a_template_that_drops_a_last_call_turn_gets_its_end_from_a_render_with_results():
    """Before: refused at 'stop tokens' (the call turn alone renders as nothing). After: the turn's end is read where
    a tool result follows it, and the suffix follows that token as past turns render it."""
    ctx = _nemotron_json()
    assert (ctx.rules.wire, ctx.rules.boundary, ctx.rules.rerenders_call_turn) == ("nemotron_json", "<SPECIAL_12>",
                                                                                   True)


def test_nemotron_json_calls_parse_and_three_rounds_are_suffix_exact():
    ctx = _nemotron_json()
    text = '<TOOLCALL>[{"name": "run_python", "arguments": {"code": "print(1)"}}]</TOOLCALL>\n<SPECIAL_12>'
    parsed = ctx.parse_completion(ctx.encode(text), seq=0, tools=TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("run_python", {"code": "print(1)"})]
    w = walk(ctx, [Turn([("run_python", {"code": "x = 2"})], [""]),
                   Turn([("lookup", {"word": "a"}), ("run_python", {"code": "x"})], ["a: x", "2"])])
    assert "<SPECIAL_11>User\n<TOOL_RESPONSE>[a: x, 2]</TOOL_RESPONSE>\n" in ctx.decode(w.suffixes[1].ids)


# ---------------------------------------------------------------- Apertus: arguments as JSON text

def test_apertus_reads_a_call_whose_arguments_are_json_text_as_its_history_writes_them():
    """llama.cpp's Apertus template writes a past call's arguments with tojson: the JSON text an OpenAI-style client
    sends becomes {"run_python": "{\\"code\\": ...}"} in the history, and a model that copies its history writes its
    next call so. Before: that call read as ('', '') with an error; after: the key is the name (vLLM's apertus parser
    reads it so) and the JSON text its arguments."""
    ctx = ctx_for("apertus")
    conv = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "run_python", "arguments": '{"code": "x = 2"}'}}]},
            {"role": "tool", "content": "", "tool_call_id": "c1", "name": "run_python"}]
    history = ctx.tokenizer.apply_chat_template(conv, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert '<|tools_prefix|>[{"run_python": "{\\"code\\": \\"x = 2\\"}"}]<|tools_suffix|>' in history
    completion = '<|tools_prefix|>[{"run_python": "{\\"code\\": \\"print(x)\\\\n\\"}"}]<|tools_suffix|>'
    for template in ("apertus", "apertus_vllm"):
        ctx = ctx_for(template)
        parsed = ctx.parse_completion(ctx.encode(completion), seq=1, tools=TOOLS, calls_before=1)
        assert [(c.name, json.loads(c.arguments), c.error) for c in parsed.tool_calls] == [
            ("run_python", {"code": "print(x)\n"}, None)]


def test_apertus_json_text_that_is_no_object_is_an_error_naming_the_tool():
    ctx = ctx_for("apertus")
    parsed = ctx.parse_completion(ctx.encode('<|tools_prefix|>[{"run_python": "print(1)"}]<|tools_suffix|>'),
                                  seq=1, tools=TOOLS, calls_before=1)
    (call,) = parsed.tool_calls
    assert call.name == "run_python" and call.error and "not valid JSON" in call.error
