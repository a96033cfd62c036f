"""The JSON-in-markers wire format: the arguments are JSON text (kept exactly as written).

- ``hermes`` (Qwen2.5/Qwen3 and most ChatML models): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
- ``llama3``: the whole answer is ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``)
- ``deepseek``: ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>``
  (V3), or ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`` (V3.1)
- ``gemma4``: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>``: Gemma's JSON dialect (bare
  keys, ``<|"|>``-delimited strings), read per call with transformers' own dialect reader
  (``content_parsers._json``, what trl's Gemma 4 response schema uses); the model writes no JSON,
  so ``arguments`` is the JSON of what it wrote.
"""

from __future__ import annotations

import json
import re

from transformers.utils.chat_parsing.content_parsers import _json as dialect_json

from .parsing import (
    _DECODER,
    _WS,
    Parsed,
    RawCall,
    WireFormat,
    arguments_object_text,
    call_from_json,
    read_blocks,
    short,
)
from .values import ToolIndex, arguments_json

# ---------------------------------------------------------------- hermes

_HERMES_EXAMPLE = '<tool_call>\n{"name": "<tool name>", "arguments": {...}}\n</tool_call>'


def parse_hermes(text: str, tools: ToolIndex | None = None) -> Parsed:
    content, calls = read_blocks(text, "<tool_call>", "</tool_call>", _HERMES_EXAMPLE,
                                 lambda body: call_from_json(body, ("arguments", "parameters"), _HERMES_EXAMPLE))
    return content, None, calls


# ---------------------------------------------------------------- llama 3.x

_LLAMA_EXAMPLE = '{"name": "<tool name>", "parameters": {...}}'


def parse_llama3(text: str, tools: ToolIndex | None = None) -> Parsed:
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):].strip()
    elif not body.startswith("{"):
        return text.strip(), None, []
    calls: list[RawCall] = []
    # One call per JSON object; several may be separated by ';' or newlines.
    pos = 0
    while pos < len(body):
        pos = _WS.match(body, pos).end()
        if pos >= len(body):
            break
        try:
            _, end = _DECODER.raw_decode(body, pos)
        except (json.JSONDecodeError, RecursionError):
            calls.append(call_from_json(body[pos:], ("parameters", "arguments"), _LLAMA_EXAMPLE))
            break
        calls.append(call_from_json(body[pos:end], ("parameters", "arguments"), _LLAMA_EXAMPLE))
        pos = _WS.match(body, end).end()
        if pos < len(body) and body[pos] == ";":
            pos += 1
    return "", None, calls


# ---------------------------------------------------------------- deepseek

_DS_BEGIN, _DS_END, _DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_DS_CALLS = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
_DS_FENCED = re.compile(r"(?P<name>[^\n]+)\n```(?:json)?\n(?P<args>.*)\n```\s*", re.DOTALL)
_DS_EXAMPLE = f'{_DS_CALLS[0]}{_DS_BEGIN}function{_DS_SEP}<tool name>\n```json\n{{...}}\n```{_DS_END}{_DS_CALLS[1]}'


def _deepseek_call(body: str) -> RawCall:
    head, sep, rest = body.partition(_DS_SEP)
    fenced = _DS_FENCED.fullmatch(rest)
    name, args = (fenced["name"], fenced["args"]) if fenced else (head, rest)  # V3 fenced, else V3.1
    if not sep or not name.strip():
        return RawCall("", "", f"the tool call has no name: {short(body)}; write {_DS_EXAMPLE}")
    arguments, error = arguments_object_text(args, _DS_EXAMPLE)
    return RawCall(name.strip(), arguments, error)


def parse_deepseek(text: str, tools: ToolIndex | None = None) -> Parsed:
    content, calls = read_blocks(text, _DS_BEGIN, _DS_END, _DS_EXAMPLE, _deepseek_call)
    for marker in _DS_CALLS:
        content = content.replace(marker, "")
    return content.strip(), None, calls


# ---------------------------------------------------------------- gemma 4

_G_OPEN, _G_CLOSE, _G_QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_G_DIALECT = {"string_delims": [[_G_QUOTE, _G_QUOTE]], "unquoted_keys": True}
_G_EXAMPLE = f"{_G_OPEN}call:<tool name>{{key:{_G_QUOTE}text{_G_QUOTE},n:3}}{_G_CLOSE}"


def _gemma4_call(body: str) -> RawCall:
    name, brace, args = body.partition("{")
    name = name.removeprefix("call:").strip()
    if not brace or not name:
        return RawCall("", "", f"the tool call has no 'call:NAME{{' head: {short(body)}; write {_G_EXAMPLE}")
    try:
        value = dialect_json("{" + args, _G_DIALECT)
    except (ValueError, RecursionError) as e:
        msg = str(e).splitlines()[0]
        return RawCall(name, "", f"the arguments of {name} do not parse ({msg}): {short(args)}; write {_G_EXAMPLE}")
    if not isinstance(value, dict):
        return RawCall(name, "", f"the arguments of {name} must be an object; write {_G_EXAMPLE}")
    return RawCall(name, arguments_json(value))


def parse_gemma4(text: str, tools: ToolIndex | None = None) -> Parsed:
    content, calls = read_blocks(text, _G_OPEN, _G_CLOSE, _G_EXAMPLE, _gemma4_call)
    return content, None, calls


HERMES = WireFormat("hermes", parse_hermes, _HERMES_EXAMPLE)
LLAMA3 = WireFormat("llama3", parse_llama3, _LLAMA_EXAMPLE)
DEEPSEEK = WireFormat("deepseek", parse_deepseek, _DS_EXAMPLE)
GEMMA4 = WireFormat("gemma4", parse_gemma4, _G_EXAMPLE)
