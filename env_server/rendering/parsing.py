"""Tool-call parsing: what every wire format shares, and the registry of wire formats.

Why our own parsers and not ``transformers``' ``parse_response`` at run time (measured in
/work/research-families/REPORT.md §3): its response templates decode the arguments into Python
objects, so the JSON text the model wrote is lost (the trainer's contract is "arguments: the
JSON text as written"); one malformed call makes the whole message fail, while each malformed
call must get its own tool message saying what was wrong; it strips whitespace from XML/GLM
values (code loses its trailing newline), cannot see closers inside strings (an LFM ``)`` or an
XML ``</parameter>`` inside a value cuts it), misses gpt-oss's real header order and GLM-4.7's
newline-free form, and covers nothing for DeepSeek. It is right on well-formed Hermes, Llama 3
and Gemma 4 output, so the tests use it as an oracle there; its schema typing rules
(``_coerce``) are reused as is (values.py), and so is its JSON-dialect reader for Gemma 4.

So there is one parser per wire format, not per family; a family is a configuration of one:
- ``parse_json``: JSON in markers: ``hermes`` (Qwen2.5/3 ``<tool_call>``), ``llama3`` (bare
  ``{"name", "parameters"}``), ``deepseek`` (``<｜tool▁call▁begin｜>`` markers, fenced JSON),
  ``gemma4`` (``<|tool_call>call:NAME{...}`` in Gemma's JSON dialect);
- ``parse_xml``: ``xml`` (``<function=NAME><parameter=K>`` of Qwen3.5+/Nemotron 3, and the
  ``<atem:invoke name=..>`` attribute syntax) and ``arg_kv`` (GLM ``<arg_key>/<arg_value>``);
- ``parse_pythonic``: ``pythonic`` and ``pythonic_raw`` (LFM2 ``[f(a='x')]``, read with ``ast``, never
  ``eval``; Python string literals, or the LFM2.5 template's unescaped ones);
- ``parse_harmony``: ``harmony`` (gpt-oss channels).

A parser takes the completion text without its stop token (harmony keeps it: ``<|call|>``
delimits a call) and with reasoning already split off, plus the session's tools (to type raw
values), and returns ``(content, reasoning, calls)``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from json.decoder import scanstring

from .values import ToolIndex

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


@dataclass
class RawCall:
    """A call before ids are assigned."""

    name: str
    arguments: str
    error: str | None = None
    id: str = ""  # the call id the model wrote, in formats that carry one (Mistral-style "id")


Parsed = tuple[str, "str | None", list[RawCall]]


@dataclass(frozen=True)
class WireFormat:
    name: str
    parse: Callable[[str, ToolIndex | None], Parsed]
    example: str  # what a well-formed call looks like, for error messages
    delimited_by_stop: bool = False  # the stop token is part of the call (harmony's <|call|>)


def json_object_spans(text: str) -> dict[str, tuple[object, str]]:
    """Parse a JSON object, returning ``key -> (value, raw JSON text of the value)``.

    Raises ValueError (with json's position message) if ``text`` is not exactly one object.
    """
    end = len(text)
    pos = _WS.match(text, 0).end()
    if pos >= end or text[pos] != "{":
        raise ValueError("expected a JSON object starting with '{'")
    pos = _WS.match(text, pos + 1).end()
    out: dict[str, tuple[object, str]] = {}
    if pos < end and text[pos] == "}":
        pos += 1
    else:
        while True:
            if pos >= end or text[pos] != '"':
                raise ValueError(f"expected a property name in double quotes at char {pos}")
            key, pos = scanstring(text, pos + 1)
            pos = _WS.match(text, pos).end()
            if pos >= end or text[pos] != ":":
                raise ValueError(f"expected ':' after property name at char {pos}")
            pos = _WS.match(text, pos + 1).end()
            try:
                value, value_end = _DECODER.raw_decode(text, pos)
            except json.JSONDecodeError as e:
                raise ValueError(f"{e.msg} at char {e.pos}") from None
            except RecursionError:  # the model nested arrays/objects thousands deep
                raise ValueError(f"the value at char {pos} is nested too deeply") from None
            out[key] = (value, text[pos:value_end])
            pos = _WS.match(text, value_end).end()
            if pos < end and text[pos] == ",":
                pos = _WS.match(text, pos + 1).end()
                continue
            if pos < end and text[pos] == "}":
                pos += 1
                break
            raise ValueError(f"expected ',' or '}}' at char {pos}")
    if _WS.match(text, pos).end() != end:
        raise ValueError(f"extra text after the JSON object at char {pos}")
    return out


def short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def arguments_object_text(text: str, example: str) -> tuple[str, str | None]:
    """(the arguments JSON text as written, error): it must be one JSON object."""
    body = text.strip()
    try:
        json_object_spans(body)
    except ValueError as e:
        return "", f"the arguments are not valid JSON ({e}): {short(body)}; write {example}"
    return body, None


def _arguments_text(fields: dict[str, tuple[object, str]], keys: tuple[str, ...]) -> tuple[str | None, str | None]:
    """(arguments JSON text, error) from the first of ``keys`` present; missing means ``{}``."""
    for key in keys:
        if key not in fields:
            continue
        value, raw = fields[key]
        if isinstance(value, dict):
            return raw, None
        if isinstance(value, str):
            # Some models write the arguments object as a JSON string; accept it if it holds an object.
            try:
                inner = json.loads(value)
            except (ValueError, RecursionError):
                inner = None
            if isinstance(inner, dict):
                return value, None
        return None, f'"{key}" must be a JSON object of arguments, got {short(raw)}'
    return "{}", None


def call_from_json(body: str, arg_keys: tuple[str, ...], example: str) -> RawCall:
    """A call from ``{"name": ..., "<arg key>": {...}}`` text; malformed input gives a call with ``error``."""
    try:
        fields = json_object_spans(body)
    except ValueError as e:
        return RawCall("", "", f"the tool call is not valid JSON ({e}): {short(body.strip())}; write {example}")
    name = fields.get("name", (None, ""))[0]
    if not isinstance(name, str) or not name.strip():
        return RawCall("", "", f'the tool call has no "name" string: {short(body.strip())}; write {example}')
    arguments, error = _arguments_text(fields, arg_keys)
    if error:
        return RawCall(name, "", f"{error}; write {example}")
    written_id = fields.get("id", ("", ""))[0]
    return RawCall(name, arguments or "{}", None, written_id if isinstance(written_id, str) else "")


def split_reasoning(text: str, open_tag: str, close_tag: str, prefilled: bool = True) -> tuple[str | None, str]:
    """(reasoning, rest). A lone close tag means the prompt opened the block (``prefilled``: the
    generation prompt ends with the open tag, e.g. Qwen3.5's '<think>\n'); otherwise it is text."""
    if not prefilled and open_tag not in text:
        return None, text
    if close_tag not in text:
        if open_tag in text:  # reasoning never closed (cut by length): all of it is reasoning
            before, _, after = text.partition(open_tag)
            return after.strip("\n"), before
        return None, text
    head, _, rest = text.partition(close_tag)
    reasoning = head.split(open_tag)[-1]
    return reasoning.strip("\n"), rest


def blocks(text: str, open_tag: str, close_tag: str) -> list[tuple[int, int, int]]:
    """``(start, body_end, end)`` of each ``open_tag ... close_tag`` block; an unclosed one runs to the end
    (``body_end == end == len(text)``, which callers report as not closed)."""
    out, pos = [], 0
    while (start := text.find(open_tag, pos)) >= 0:
        close = text.find(close_tag, start + len(open_tag))
        if close < 0:
            out.append((start, len(text), len(text)))
            break
        out.append((start, close, close + len(close_tag)))
        pos = close + len(close_tag)
    return out


def read_blocks(text: str, open_tag: str, close_tag: str, example: str,
                read: Callable[[str], RawCall | list[RawCall]],
                spans: list[tuple[int, int, int]] | None = None) -> tuple[str, list[RawCall]]:
    """(the text outside the blocks, the calls ``read`` finds in each block body); an unclosed block is a
    malformed call. ``spans``: the blocks, when the format finds them its own way."""
    spans = blocks(text, open_tag, close_tag) if spans is None else spans
    calls: list[RawCall] = []
    for start, body_end, end in spans:
        if body_end == end:
            calls.append(RawCall("", "", f"a tool call ({open_tag}) was not closed with {close_tag}; write {example}"))
            continue
        found = read(text[start + len(open_tag):body_end])
        calls.extend(found if isinstance(found, list) else [found])
    return outside(text, spans), calls


def outside(text: str, spans: list[tuple[int, int, int]]) -> str:
    """The text outside the given blocks, stripped (the visible answer)."""
    parts, pos = [], 0
    for start, _, end in spans:
        parts.append(text[pos:start])
        pos = end
    parts.append(text[pos:])
    return "".join(parts).strip()


def formats() -> dict[str, WireFormat]:
    """Every wire format, in the order registration tries them."""
    from .parse_harmony import HARMONY
    from .parse_json import DEEPSEEK, GEMMA4, HERMES, LLAMA3
    from .parse_pythonic import PYTHONIC, PYTHONIC_RAW
    from .parse_xml import ARG_KV, XML

    return {f.name: f for f in (HARMONY, GEMMA4, DEEPSEEK, ARG_KV, PYTHONIC, PYTHONIC_RAW, XML, LLAMA3, HERMES)}
