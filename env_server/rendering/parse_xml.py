"""Raw-text-value wire formats: one tag per argument, values typed by the tool's schema.

- ``xml``: ``<tool_call>\\n<function=NAME>\\n<parameter=K>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``
  (Qwen3.5/3.6/3.8, Qwen3-Coder, Nemotron 3). The template writes ``\\n`` + value + ``\\n``, so exactly
  one leading and one trailing newline are removed (a value's own trailing newline is kept,
  unlike ``parse_response``). The attribute syntax ``<atem:invoke name="NAME"><atem:parameter
  name="K">VALUE</atem:parameter>`` is the same format with other tags and no added newlines.
- ``arg_kv`` (GLM-4.5/4.6/4.7): ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>``;
  GLM-4.7 drops the newlines. Values are written raw.

A closing tag inside a value (code that prints ``"</parameter>"``) is taken as the value's end
only where the next tag follows it, so such values survive. String parameters keep their text;
the others are parsed per their JSON Schema type (values.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .parsing import Parsed, RawCall, WireFormat, blocks, outside, read_blocks, short
from .values import ToolIndex, arguments_json, typed_value


@dataclass(frozen=True)
class TagSyntax:
    call_open: re.Pattern  # group 1: the function name
    call_close: str
    param_open: re.Pattern  # group 1: the parameter name
    param_close: str
    newlines: bool  # the template wraps each value in one newline on each side
    example: str


QWEN_XML = TagSyntax(
    re.compile(r"<function=([^>\n]+)>"), "</function>", re.compile(r"<parameter=([^>\n]+)>"), "</parameter>", True,
    "<tool_call>\n<function=<tool name>>\n<parameter=<name>>\n<value>\n</parameter>\n</function>\n</tool_call>",
)
ATEM_XML = TagSyntax(
    re.compile(r'<atem:invoke name="([^"\n]+)">'), "</atem:invoke>",
    re.compile(r'<atem:parameter name="([^"\n]+)">'), "</atem:parameter>", False,
    '<atem:function_calls>\n<atem:invoke name="<tool name>">\n<atem:parameter name="<name>"><value>'
    "</atem:parameter>\n</atem:invoke>\n</atem:function_calls>",
)


def _value_end(text: str, pos: int, close: str, next_tags: re.Pattern) -> int:
    """Where the value starting at ``pos`` ends: the first ``close`` followed by the next tag or the end."""
    search = pos
    while (at := text.find(close, search)) >= 0:
        if next_tags.match(text, at + len(close)):
            return at
        search = at + 1
    return -1


def _params(text: str, pos: int, end: int, name: str, syn: TagSyntax, tools: ToolIndex | None):
    """Parameters from ``pos`` up to the call's closing tag: (arguments, error)."""
    after_value = re.compile(r"\s*(?:" + syn.param_open.pattern + "|" + re.escape(syn.call_close) + r"|\Z)")
    args: dict = {}
    while True:
        pos = len(text[pos:end]) - len(text[pos:end].lstrip()) + pos
        if text.startswith(syn.call_close, pos):
            return args, None
        m = syn.param_open.match(text, pos, end)
        if not m:
            return args, f"expected {syn.param_open.pattern} or {syn.call_close} at {short(text[pos:end], 60)!r}"
        value_end = _value_end(text[:end], m.end(), syn.param_close, after_value)
        if value_end < 0:
            return args, f"the parameter {m[1]!r} was not closed with {syn.param_close}"
        raw = text[m.end():value_end]
        if syn.newlines:
            raw = raw.removeprefix("\n").removesuffix("\n")
        args[m[1].strip()] = typed_value(tools, name, m[1].strip(), raw)
        pos = value_end + len(syn.param_close)


def _xml_calls(text: str, syn: TagSyntax, tools: ToolIndex | None) -> list[RawCall]:
    calls = []
    for m in syn.call_open.finditer(text):
        name = m[1].strip()
        close = text.rfind(syn.call_close, m.end(), _next_call(text, syn, m.end()))
        if close < 0:
            calls.append(RawCall(name, "", f"the call to {name} was not closed with {syn.call_close}; "
                                           f"write {syn.example}"))
            continue
        args, error = _params(text, m.end(), close + len(syn.call_close), name, syn, tools)
        calls.append(RawCall(name, "", f"{error}; write {syn.example}") if error else RawCall(name, arguments_json(args)))
    return calls


def _next_call(text: str, syn: TagSyntax, pos: int) -> int:
    m = syn.call_open.search(text, pos)
    return m.start() if m else len(text)


def parse_xml(text: str, tools: ToolIndex | None = None) -> Parsed:
    for syn, wrapper in ((QWEN_XML, ("<tool_call>", "</tool_call>")),
                         (ATEM_XML, ("<atem:function_calls>", "</atem:function_calls>"))):
        if syn.call_open.search(text):
            return outside(text, blocks(text, *wrapper)), None, _xml_calls(text, syn, tools)
    # A <tool_call> without a function tag is a malformed call, not plain text.
    spans = blocks(text, "<tool_call>", "</tool_call>")
    calls = [RawCall("", "", f"the tool call has no <function=NAME> tag: {short(text[s:e])}; write {QWEN_XML.example}")
             for s, _, e in spans]
    return outside(text, spans), None, calls


# ---------------------------------------------------------------- GLM arg_key / arg_value

_KV_EXAMPLE = "<tool_call><tool name>\n<arg_key><name></arg_key>\n<arg_value><value></arg_value>\n</tool_call>"
_KV_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>", re.DOTALL)
_KV_NEXT = re.compile(r"\s*(?:<arg_key>|</tool_call>|\Z)")


def _kv_call(body: str, tools: ToolIndex | None) -> RawCall:
    head = body.find("<arg_key>")
    name = (body if head < 0 else body[:head]).strip()
    if not name:
        return RawCall("", "", f"the tool call has no name: {short(body)}; write {_KV_EXAMPLE}")
    args: dict = {}
    pos = len(name) if head < 0 else head
    while pos < len(body) and body[pos:].strip():
        m = _KV_PAIR.match(body, pos)
        if not m:
            return RawCall(name, "", f"expected <arg_key>..</arg_key><arg_value> at {short(body[pos:], 60)!r}; "
                                     f"write {_KV_EXAMPLE}")
        end = _value_end(body, m.end(), "</arg_value>", _KV_NEXT)
        if end < 0:
            return RawCall(name, "", f"the value of {m[1]!r} was not closed with </arg_value>; write {_KV_EXAMPLE}")
        key = m[1].strip()
        args[key] = typed_value(tools, name, key, body[m.end():end])
        pos = end + len("</arg_value>")
    return RawCall(name, arguments_json(args))


def parse_arg_kv(text: str, tools: ToolIndex | None = None) -> Parsed:
    content, calls = read_blocks(text, "<tool_call>", "</tool_call>", _KV_EXAMPLE, lambda body: _kv_call(body, tools),
                                 spans=_kv_blocks(text))
    return content, None, calls


def _kv_blocks(text: str) -> list[tuple[int, int, int]]:
    """Like parsing.blocks, but a ``</tool_call>`` inside a value does not end the call."""
    out, pos = [], 0
    while (start := text.find("<tool_call>", pos)) >= 0:
        search = start
        while True:
            close = text.find("</tool_call>", search)
            if close < 0:
                out.append((start, len(text), len(text)))
                return out
            # Inside a value when an <arg_value> opened after the last </arg_value>.
            body = text[start:close]
            if body.rfind("<arg_value>") <= body.rfind("</arg_value>"):
                break
            search = close + 1
        out.append((start, close, close + len("</tool_call>")))
        pos = close + len("</tool_call>")
    return out


XML = WireFormat("xml", parse_xml, QWEN_XML.example)
ARG_KV = WireFormat("arg_kv", parse_arg_kv, _KV_EXAMPLE)
