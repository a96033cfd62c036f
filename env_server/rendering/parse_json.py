"""JSON wire formats: the arguments are JSON text, kept as written (retyped only where the schema says so).

The JSON parser decides where a call ends: a call region starts at the family's marker, and
``json.JSONDecoder.raw_decode`` reads the value from there, so markup inside a string value
(a file holding ``</tool_call>`` or a whole ``<tool_call>`` block) is part of the value, never a
boundary, and never a second call. One table of families (``JsonCalls``): call objects ``{"name": ..., "arguments": {...}}`` (or a list of them) after a marker:
  ``hermes`` (Qwen2.5/3 ``<tool_call>...</tool_call>``), ``qwen_coder`` (``<tools>``), ``internlm2``
  (``<|action_start|><|plugin|>``), ``minimax_m1`` (``<tool_calls>``, one object per line),
  ``nemotron_json`` (``<TOOLCALL>[...]</TOOLCALL>``), ``granite`` (``<|tool_call|>[...]``), ``mistral_v3``
  (``[TOOL_CALLS][...]``, with the model's 9-character ``"id"``), ``phi4`` (``functools[...]``, and the
  bare objects its template writes for past calls), and
  the bare ones, found after prose too: ``llama3`` (``{"name", "parameters"}``, optionally after
  ``<|python_tag|>``; Llama 4 writes several back to back) and ``json_list`` (xLAM's ``[{...}]``).

Named calls (a marker, the name, then the arguments object: DeepSeek, Kimi, Mistral v11) are read in
parse_named.py, with the same reader of arguments (json_arguments.py). Gemma 4's JSON dialect is read in parse_gemma4.py.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from .calls import _DECODER, _WS, Parsed, RawCall, WireFormat, json_object_spans, outside, short
from .json_arguments import arguments_text, decode_value
from .parse_named import MISTRAL_V11, parse_named_calls
from .values import ToolIndex

_SEPARATORS = re.compile(r"[ \t\n\r]*[,;]?[ \t\n\r]*")


# ---------------------------------------------------------------- call objects


@dataclass(frozen=True)
class JsonCalls:
    """Call objects (or lists of them) after a marker; the JSON decides where each ends."""

    name: str  # the wire format's key
    family: str  # RegisterTokenizerResponse.template_family
    opens: tuple[str, ...]  # markers a call region starts with
    example: str
    close: str = ""  # the marker that ends a region ("": the JSON's end does)
    bare: re.Pattern | None = None  # where a region with no marker starts (matched anywhere: after prose too)
    arg_keys: tuple[str, ...] = ("arguments", "parameters")
    name_is_key: bool = False  # {"NAME": {arguments}} (Apertus)
    fences: tuple[str, ...] = ()  # a bare region may sit in a Markdown fence (```json ... ```)
    # Not strict: a region left open at the end of the output is read, as the family's deployment parser does
    # (vLLM's hermes reads `<tool_call>(.*)` to the end).
    open_at_end: bool = False


def _written_id(fields: dict[str, tuple[Any, str]]) -> str:
    """The call id the model wrote (Mistral's ``"id"``), if a string."""
    value = fields.get("id", ("", ""))[0]
    return value if isinstance(value, str) else ""


def _call_object(fmt: JsonCalls, raw: str, tools: ToolIndex | None) -> RawCall:
    """One call from the JSON text of an object; a malformed one is a call with ``error``."""
    try:
        fields = json_object_spans(raw)
    except ValueError as e:
        return RawCall("", "", f"the tool call is not a JSON object ({e}): {short(raw.strip())}; write {fmt.example}")
    if "function" in fields and isinstance(fields["function"][0], dict) and "name" not in fields:
        inner = fields["function"][1]  # OpenAI's shape: {"type": "function", "function": {...}}
        call = _call_object(fmt, inner, tools)
        return RawCall(call.name, call.arguments, call.error, _written_id(fields))
    if fmt.name_is_key and len(fields) == 1:
        (name, (value, value_raw)), = fields.items()
        if isinstance(value, dict):
            return RawCall(name, *arguments_text(name, value_raw, tools, fmt.example))
        if isinstance(value, str) and name not in ("name", "function"):
            # Arguments as JSON text: llama.cpp's Apertus template writes OpenAI-style ones so in past turns (tojson).
            return RawCall(name, *arguments_text(name, value, tools, fmt.example))
    name = fields.get("name", (None, ""))[0]
    if not isinstance(name, str) or not name.strip():
        return RawCall("", "", f'the tool call has no "name" string: {short(raw.strip())}; write {fmt.example}')
    written_id = _written_id(fields)
    for key in fmt.arg_keys:
        if key in fields:
            value, value_raw = fields[key]
            if not isinstance(value, (dict, str)):
                return RawCall(name, "", f'"{key}" must be a JSON object of arguments, got {short(value_raw)}; '
                                         f"write {fmt.example}", written_id)
            arguments, error = arguments_text(name, value if isinstance(value, str) else value_raw, tools, fmt.example)
            return RawCall(name, arguments, error, written_id)
    return RawCall(name, "{}", None, written_id)


def _values(text: str, pos: int, fmt: JsonCalls, tools: ToolIndex | None) -> tuple[list[RawCall], int]:
    """The calls of one region from ``pos``: JSON values (objects, or lists of objects) separated by
    whitespace, ',' or ';'; after the first, a value must look like a call. Returns (calls, the end of
    the last value). Raises ValueError (the message for the model) when a value is not JSON."""
    calls: list[RawCall] = []
    end, at = pos, _WS.match(text, pos).end()
    while at < len(text) and text[at] in "[{" and (not calls or _CALL_OBJECT.match(text, at)
                                                    or _CALL_LIST.match(text, at)):
        if text[at] == "{":
            _, end = decode_value(text, at)
            calls.append(_call_object(fmt, text[at:end], tools))
        else:
            end = _list(text, at, fmt, tools, calls)
        at = _SEPARATORS.match(text, end).end()
    return calls, end


def _list(text: str, pos: int, fmt: JsonCalls, tools: ToolIndex | None, calls: list[RawCall]) -> int:
    """Read a JSON list of call objects at ``pos`` into ``calls``; returns its end. Raises ValueError."""
    _, end = decode_value(text, pos)  # the whole list must be JSON
    at = _WS.match(text, pos + 1).end()
    while text[at] != "]":
        _, item_end = _DECODER.raw_decode(text, at)
        if text[at] != "{":
            calls.append(RawCall("", "", f"each tool call must be a JSON object, got {short(text[at:item_end])}; "
                                         f"write {fmt.example}"))
        else:
            calls.append(_call_object(fmt, text[at:item_end], tools))
        at = _WS.match(text, item_end).end()
        at = _WS.match(text, at + 1).end() if text[at] == "," else at
    return end


def _next_region(text: str, pos: int, fmt: JsonCalls) -> tuple[int, int] | None:
    """(start, where its JSON starts) of the next call region at or after ``pos``."""
    best: tuple[int, int] | None = None
    for marker in fmt.opens:
        at = text.find(marker, pos)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, at + len(marker))
    if fmt.bare is not None:
        m = fmt.bare.search(text, pos, best[0] if best else len(text))
        if m:
            best = (m.start(), m.start())
    return best


def parse_json_calls(fmt: JsonCalls, text: str, tools: ToolIndex | None = None, strict: bool = False) -> Parsed:
    spans: list[tuple[int, int, int]] = []
    calls: list[RawCall] = []
    pos = 0
    while (region := _next_region(text, pos, fmt)) is not None:
        start, at = region
        try:
            found, end = _values(text, at, fmt, tools)
        except ValueError as e:
            found, end = [RawCall("", "", f"{e}; write {fmt.example}")], _region_end(text, at, fmt, at > start)
        else:
            if not found:
                found = [RawCall("", "", f"the tool call after {text[start:at]} is not valid JSON (a call starts with "
                                         f"'{{'): {short(text[at:].strip(), 80)!r}; write {fmt.example}")]
                end = _region_end(text, at, fmt, at > start)
            elif fmt.close:
                close_at = _WS.match(text, end).end()
                if text.startswith(fmt.close, close_at):
                    end = close_at + len(fmt.close)
                elif close_at == len(text) and fmt.open_at_end and not strict:
                    repair = f"closed {text[start:at]} with {fmt.close} at the end of the output"
                    found = [dataclasses.replace(c, repairs=c.repairs + (repair,)) for c in found]
                    end = close_at
                else:
                    later = text.find(fmt.close, close_at)
                    error = (f"unexpected text {short(text[close_at:later], 60)!r} after the tool call's JSON, before "
                             f"{fmt.close}" if later >= 0 else
                             f"a tool call ({text[start:at]}) was not closed with {fmt.close}")
                    error += f"; write {fmt.example}"
                    found = [RawCall(c.name, "", c.error or error, c.id) for c in found]
                    end = _region_end(text, end, fmt, at > start)
        if at == start and not _is_call(text[start:end], tools):
            pos = start + 1  # a JSON answer in the prose ({"name": "Bob"}), not a call
            continue
        if fmt.fences:
            start, end = _fenced(text, start, end, fmt.fences)
        spans.append((start, end, end))
        calls.extend(found)
        pos = max(end, at + 1)
    return outside(text, spans), None, calls


def _is_call(segment: str, tools: ToolIndex | None) -> bool:
    """Whether JSON found with no marker is a call: it has arguments, or names one of the session's tools."""
    return bool(_ARGS_KEY.search(segment)) or any(f'"{name}"' in segment for name in tools or ())


def _region_end(text: str, pos: int, fmt: JsonCalls, marked: bool = False) -> int:
    """Where a region that does not read ends: its close marker, else the next region (after a marker, the next
    marker: Phi-4-mini's bare objects inside a broken functools[...] are that region's), else the text's end."""
    if fmt.close and (at := text.find(fmt.close, pos)) >= 0:
        return at + len(fmt.close)
    following = _next_region(text, pos + 1, dataclasses.replace(fmt, bare=None) if marked else fmt)
    return following[0] if following else len(text)


def _fenced(text: str, start: int, end: int, fences: tuple[str, ...]) -> tuple[int, int]:
    """The region widened to the Markdown fence around it, if there is one."""
    for fence in fences:
        before = text.rfind(fence, 0, start)
        if before >= 0 and not text[before + len(fence):start].strip():
            after = _WS.match(text, end).end()
            if text.startswith("```", after):
                return before, after + 3
    return start, end


# ---------------------------------------------------------------- the families

_OBJ = '{"name": "<tool name>", "arguments": {...}}'
_CALL_OBJECT = re.compile(r'\{\s*(?:"(?:name|function)"\s*:|"type"\s*:\s*"function")')
_CALL_LIST = re.compile(r'\[\s*\{\s*(?:"(?:name|function)"\s*:|"type"\s*:\s*"function")')
_ARGS_KEY = re.compile(r'"(?:arguments|parameters)"\s*:')
_NAME_ARGUMENTS = re.compile(r'\{\s*"name"\s*:\s*"[^"\\]*"\s*,\s*"arguments"\s*:')

JSON_FAMILIES = (
    JsonCalls("hermes", "qwen", ("<tool_call>",), f"<tool_call>\n{_OBJ}\n</tool_call>", close="</tool_call>",
              open_at_end=True),
    JsonCalls("qwen_coder", "qwen-coder", ("<tools>",), f"<tools>\n{_OBJ}\n</tools>", close="</tools>"),
    JsonCalls("internlm2", "internlm2", ("<|action_start|><|plugin|>",), f"<|action_start|><|plugin|>\n{_OBJ}"
              "<|action_end|>", close="<|action_end|>"),
    JsonCalls("minimax_m1", "minimax-m1", ("<tool_calls>",), f"<tool_calls>\n{_OBJ}\n</tool_calls>",
              close="</tool_calls>"),
    JsonCalls("nemotron_json", "nemotron-json", ("<TOOLCALL>",), f"<TOOLCALL>[{_OBJ}]</TOOLCALL>", close="</TOOLCALL>"),
    JsonCalls("granite", "granite", ("<|tool_call|>",), f"<|tool_call|>[{_OBJ}]"),
    JsonCalls("mistral_v3", "mistral", ("[TOOL_CALLS]",),
              '[TOOL_CALLS][{"name": "<tool name>", "arguments": {...}, "id": "<9 letters or digits>"}]'),
    JsonCalls("apertus", "apertus", ("<|tools_prefix|>",), '<|tools_prefix|>[{"<tool name>": {...}}]<|tools_suffix|>',
              close="<|tools_suffix|>", name_is_key=True),
    JsonCalls("json_list", "json-list", (), f"[{_OBJ}]", bare=_CALL_LIST, fences=("```json", "```")),
    # Phi-4-mini writes functools[{...}, ...] (what vLLM's phi4_mini_json parser reads); its template writes past
    # calls as bare objects, {"name": ..., "arguments": ...}, which are read too (after xLAM's lists, before Llama's
    # "parameters" objects, in the order registration tries formats).
    JsonCalls("phi4", "phi4", ("functools",), f"functools[{_OBJ}]", bare=_NAME_ARGUMENTS, arg_keys=("arguments",)),
    JsonCalls("llama3", "llama3", ("<|python_tag|>",), '{"name": "<tool name>", "parameters": {...}}',
              bare=_CALL_OBJECT, arg_keys=("parameters", "arguments")),
)
_MISTRAL_V3 = next(f for f in JSON_FAMILIES if f.name == "mistral_v3")


def parse_mistral_v3(text: str, tools: ToolIndex | None = None, strict: bool = False) -> Parsed:
    """Mistral's JSON list after ``[TOOL_CALLS]`` (v3 tokenizers), or, where the first call's marker is followed by
    a name rather than JSON, the v11 shape ``[TOOL_CALLS]NAME[ARGS]{...}`` that Magistral, Devstral and Mistral
    Small 3.2 write with templates of the same family (vLLM's mistral parser tells the two apart by the tokenizer's
    version; here the first character after the marker does: '[' or '{' opens JSON, a tool name cannot)."""
    at = text.find("[TOOL_CALLS]")
    if at >= 0:
        first = _WS.match(text, at + len("[TOOL_CALLS]")).end()
        if first < len(text) and text[first] not in "[{":
            return parse_named_calls(MISTRAL_V11, text, tools, strict)
    return parse_json_calls(_MISTRAL_V3, text, tools, strict)


def _json_format(fmt: JsonCalls) -> WireFormat:
    return WireFormat(fmt.name, lambda text, tools=None, strict=False: parse_json_calls(fmt, text, tools, strict),
                      fmt.example, fmt.family, bare=fmt.bare is not None)


FORMATS = (
    *(_json_format(f) if f is not _MISTRAL_V3 else
      WireFormat(f.name, parse_mistral_v3, f.example, f.family) for f in JSON_FAMILIES),
)
