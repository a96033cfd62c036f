"""Gemma 4's calls: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>``, its own JSON dialect.

Read with transformers' own dialect reader (what trl's response schema uses): bare keys, ``<|"|>`` as the
only string delimiter (so a value cannot hold it), Python's None/True/False. A call ends at the first
``<tool_call|>`` outside a string, so a value holding Gemma's own call markup is text. The call's
``arguments`` is the JSON of what the model wrote, typed by the tool's schema.
"""

from __future__ import annotations

import re

from transformers.utils.chat_parsing.content_parsers import _json as dialect_json

from .calls import Parsed, RawCall, WireFormat, read_blocks, short
from .values import ToolIndex, arguments_json, retype

_G_OPEN, _G_CLOSE, _G_QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_G_DIALECT = {"string_delims": [[_G_QUOTE, _G_QUOTE]], "unquoted_keys": True}
_G_EXAMPLE = f"{_G_OPEN}call:<tool name>{{key:{_G_QUOTE}text{_G_QUOTE},n:3}}{_G_CLOSE}"


_PY_WORDS = re.compile(r"\b(None|True|False)\b")


def _python_words(args: str) -> str:
    """Gemma 4's template writes Python's None/True/False for non-string values: JSON's words, outside strings."""
    parts = args.split(_G_QUOTE)
    words = {"None": "null", "True": "true", "False": "false"}
    return _G_QUOTE.join(p if i % 2 else _PY_WORDS.sub(lambda m: words[m[1]], p) for i, p in enumerate(parts))


def _gemma4_call(body: str, tools: ToolIndex | None) -> RawCall:
    name, brace, args = body.partition("{")
    name = name.removeprefix("call:").strip()
    if not brace or not name:
        return RawCall("", "", f"the tool call has no 'call:NAME{{' head: {short(body)}; write {_G_EXAMPLE}")
    try:
        value = dialect_json("{" + _python_words(args), _G_DIALECT)
    except (ValueError, RecursionError) as e:
        msg = str(e).splitlines()[0]
        return RawCall(name, "", f"the arguments of {name} do not parse ({msg}): {short(args)}; write {_G_EXAMPLE}")
    if not isinstance(value, dict):
        return RawCall(name, "", f"the arguments of {name} must be an object; write {_G_EXAMPLE}")
    return RawCall(name, arguments_json({k: retype(tools, name, k, v) for k, v in value.items()}))


def _gemma4_blocks(text: str) -> list[tuple[int, int, int]]:
    """Each call's ``(start, body_end, end)``: it ends at the first ``<tool_call|>`` outside a ``<|"|>`` string
    (a value holding Gemma's own call markup is text); an unclosed one runs to the end."""
    out, pos = [], 0
    while (start := text.find(_G_OPEN, pos)) >= 0:
        at, quoted = start + len(_G_OPEN), False
        while True:
            close, quote = text.find(_G_CLOSE, at), text.find(_G_QUOTE, at)
            if quote >= 0 and (close < 0 or quote < close):
                quoted, at = not quoted, quote + len(_G_QUOTE)
            elif close >= 0 and not quoted:
                out.append((start, close, close + len(_G_CLOSE)))
                break
            elif close >= 0:
                at = close + len(_G_CLOSE)
            else:
                out.append((start, len(text), len(text)))
                return out
        pos = out[-1][2]
    return out


def parse_gemma4(text: str, tools: ToolIndex | None = None, strict: bool = False) -> Parsed:
    content, calls = read_blocks(text, _G_OPEN, _G_CLOSE, _G_EXAMPLE, lambda body: _gemma4_call(body, tools),
                                 spans=_gemma4_blocks(text))
    return content, None, calls


FORMATS = (WireFormat("gemma4", parse_gemma4, _G_EXAMPLE, "gemma4"),)
