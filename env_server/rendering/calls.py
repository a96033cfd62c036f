"""The vocabulary every wire format's reader shares: a call as read (``RawCall``), what a reader returns
(``Parsed``), a wire format (``WireFormat``), and the text helpers the readers use (JSON object spans, blocks
between markers, reasoning split-off). The readers (``parse_*``) import this module; ``parsing`` imports the
readers to list them, so the vocabulary lives apart from both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from json.decoder import scanstring

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


@dataclass
class RawCall:
    """A call before ids are assigned."""

    name: str
    arguments: str
    error: str | None = None
    id: str = ""  # the call id the model wrote, in formats that carry one (Mistral-style "id")
    repairs: tuple[str, ...] = ()  # what was read leniently, as the deployment parser reads it (not strict)


Parsed = tuple[str, "str | None", list[RawCall]]


@dataclass(frozen=True)
class WireFormat:
    name: str
    parse: Callable[..., Parsed]  # (text, tools=None, strict=False) -> Parsed
    example: str  # what a well-formed call looks like, for error messages
    family: str  # the label registration reports (RegisterTokenizerResponse.template_family)
    delimited_by_stop: bool = False  # the stop token is part of the call (harmony's <|call|>)
    bare: bool = False  # calls start with no marker of their own: registration tries these last


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
