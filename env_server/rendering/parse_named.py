"""Named-call wire formats: a marker, the tool's name (and the call id), a separator, then the arguments as a
JSON object, whose end the JSON decoder decides (markup inside a string value is part of the value). One
table of families (``NamedCalls``): ``deepseek`` (``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` + fenced
JSON, or V3.1's ``NAME<｜tool▁sep｜>{...}``), ``kimi`` (``<|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}<|tool_call_end|>``,
the written ``functions.NAME:0`` is the call id), ``mistral`` (``[TOOL_CALLS]NAME[ARGS]{...}``, with
``[CALL_ID]ID`` since Mistral Small 3.2; parse_json.py's Mistral v3 format hands such text here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .calls import _WS, Parsed, RawCall, WireFormat, outside, short
from .json_arguments import arguments_text, decode_value
from .values import ToolIndex

@dataclass(frozen=True)
class NamedCalls:
    """``OPEN head ARGS [CLOSE]``: the head names the tool (and the call id); the JSON decides where the
    arguments end."""

    name: str
    family: str
    open: str  # before each call
    head: re.Pattern  # from after ``open`` through the start of the arguments: groups ``name`` and ``id``
    example: str
    close: str = ""  # after each call's arguments
    section: tuple[str, ...] = ()  # markers around the calls, not content
    chained: bool = False  # a call may follow the previous one without a new ``open`` (Mistral)
    fence: bool = False  # the arguments may sit in a ```json fence (DeepSeek V3)


def _named_call(fmt: NamedCalls, text: str, pos: int, tools: ToolIndex | None) -> tuple[RawCall, int]:
    """The call whose head starts at ``pos``: (call, end). Raises ValueError for a head that does not read."""
    m = fmt.head.match(text, pos)
    if not m:
        raise ValueError(f"the tool call has no name and arguments marker: {short(text[pos:].strip(), 80)!r}")
    groups = m.groupdict()
    name = (groups.get("name") or groups.get("name2") or "").strip()
    written_id = (groups.get("id") or "").strip()
    at = _WS.match(text, m.end()).end()
    if fmt.fence and text.startswith("```", at):  # ```json\n
        newline = text.find("\n", at)
        at = newline + 1 if newline >= 0 else at + 3
    try:
        value, end = decode_value(text, at)
    except ValueError as e:
        return RawCall(name, "", f"{e}; write {fmt.example}", written_id), _named_end(text, at, fmt)
    if not isinstance(value, dict):
        arguments, error = arguments_text(name, value if isinstance(value, str) else text[at:end], tools, fmt.example)
    else:
        arguments, error = arguments_text(name, text[at:end], tools, fmt.example)
    after = _WS.match(text, end).end()
    if fmt.fence and text.startswith("```", after):
        after = _WS.match(text, after + 3).end()
    if fmt.close:
        if not text.startswith(fmt.close, after):
            error = error or f"the call to {name} was not closed with {fmt.close}; write {fmt.example}"
            return RawCall(name, arguments if not error else "", error, written_id), _named_end(text, end, fmt)
        end = after + len(fmt.close)
    return RawCall(name, arguments, error, written_id), end


def _named_end(text: str, pos: int, fmt: NamedCalls) -> int:
    """Where a call that does not read ends: after its close marker, or where the next call starts."""
    close = text.find(fmt.close, pos) if fmt.close else -1
    following = text.find(fmt.open, pos)
    if following >= 0 and (close < 0 or following < close):
        return following
    return close + len(fmt.close) if close >= 0 else len(text)


def parse_named_calls(fmt: NamedCalls, text: str, tools: ToolIndex | None = None, strict: bool = False) -> Parsed:
    spans: list[tuple[int, int, int]] = []
    calls: list[RawCall] = []
    pos = 0
    while (start := text.find(fmt.open, pos)) >= 0:
        at = start + len(fmt.open)
        while True:
            try:
                call, end = _named_call(fmt, text, at, tools)
            except ValueError as e:
                call, end = RawCall("", "", f"{e}; write {fmt.example}"), _named_end(text, at, fmt)
            calls.append(call)
            if not (fmt.chained and fmt.head.match(text, _WS.match(text, end).end())):
                break
            at = _WS.match(text, end).end()
        spans.append((start, end, end))
        pos = max(end, start + 1)
    content = outside(text, spans)
    for marker in fmt.section:
        content = content.replace(marker, "")
    return content.strip(), None, calls


# Mistral v11+: NAME, an optional [CALL_ID]ID, then [ARGS] — or the arguments' '{' at once where the text was
# decoded without control tokens ([ARGS] is one), as vLLM's parser tests write it: [TOOL_CALLS]add{"a": 3.5}.
_MISTRAL_HEAD = re.compile(r"\s*(?P<name>[^\s\[\]{}]+)\s*(?:\[CALL_ID\]\s*(?P<id>[^\s\[\]{}]+)\s*)?"
                           r"(?:\[ARGS\]|(?=\{))")
_DS_BEGIN, _DS_END, _DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_DS_CALLS = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")

NAMED_FAMILIES = (
    NamedCalls(
        "deepseek", "deepseek", _DS_BEGIN,
        # V3: function<sep>NAME\n```json\n{..}\n```  |  V3.1: NAME<sep>{..}
        re.compile(r"(?:function)?" + _DS_SEP + r"(?P<name>[^\n<]+)\n(?=```)|(?P<name2>[^<\n]+?)" + _DS_SEP),
        f"{_DS_CALLS[0]}{_DS_BEGIN}function{_DS_SEP}<tool name>\n```json\n{{...}}\n```{_DS_END}{_DS_CALLS[1]}",
        close=_DS_END, section=_DS_CALLS, fence=True),
    NamedCalls(
        "kimi", "kimi", "<|tool_call_begin|>",
        re.compile(r"\s*(?P<id>(?:functions\.)?(?P<name>[^\s:<]+)(?::\d+)?)\s*<\|tool_call_argument_begin\|>"),
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.<tool name>:0<|tool_call_argument_begin|>{...}"
        "<|tool_call_end|><|tool_calls_section_end|>",
        close="<|tool_call_end|>", section=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")),
    NamedCalls(
        "mistral", "mistral", "[TOOL_CALLS]",
        _MISTRAL_HEAD, "[TOOL_CALLS]<tool name>[ARGS]{...}", chained=True),
)
MISTRAL_V11 = NAMED_FAMILIES[-1]


def _named_format(fmt: NamedCalls) -> WireFormat:
    return WireFormat(fmt.name, lambda text, tools=None, strict=False: parse_named_calls(fmt, text, tools, strict),
                      fmt.example, fmt.family)



FORMATS = tuple(_named_format(f) for f in NAMED_FAMILIES)
