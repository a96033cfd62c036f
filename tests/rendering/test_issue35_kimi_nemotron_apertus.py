"""Issue 35: calls that real deployments read and tito read otherwise (Kimi K2 Thinking's earlier copy, Nemotron JSON,
Apertus)."""

from __future__ import annotations

import json

from tito.types import Message, ToolCall

from .helpers import REGISTRY, TOOLS, Turn, files_for, walk

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

