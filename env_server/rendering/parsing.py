"""Tool-call parsing of decoded completions, one parser per call format.

Why not only ``transformers``' ``parse_response``: its response templates decode the
arguments into Python objects (the JSON text the model wrote is lost, and the trainer's
contract is "arguments: the JSON text as written"), and one malformed call makes the whole
parse raise, while we must answer each malformed call with a tool message saying what was
wrong. Its templates also miss GPT-OSS's ``<|channel|>commentary to=functions.X`` order
that the model actually emits. The tests cross-check these parsers against
``parse_response`` on well-formed output.

Formats:
- ``hermes`` (Qwen2.5/Qwen3 and the default): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
- ``llama3``: the whole answer is ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``)
- ``harmony`` (GPT-OSS): ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``
"""

from __future__ import annotations

import json
import re
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


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


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
        return None, f'"{key}" must be a JSON object of arguments, got {_short(raw)}'
    return "{}", None


def call_from_json(body: str, arg_keys: tuple[str, ...], example: str) -> RawCall:
    """A call from ``{"name": ..., "<arg key>": {...}}`` text; malformed input gives a call with ``error``."""
    try:
        fields = json_object_spans(body)
    except ValueError as e:
        return RawCall("", "", f"the tool call is not valid JSON ({e}): {_short(body.strip())}; write {example}")
    name = fields.get("name", (None, ""))[0]
    if not isinstance(name, str) or not name.strip():
        return RawCall("", "", f'the tool call has no "name" string: {_short(body.strip())}; write {example}')
    arguments, error = _arguments_text(fields, arg_keys)
    if error:
        return RawCall(name, "", f"{error}; write {example}")
    return RawCall(name, arguments or "{}", None)


# ---------------------------------------------------------------- hermes / qwen

_HERMES_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_HERMES_EXAMPLE = '<tool_call>\n{"name": "<tool name>", "arguments": {...}}\n</tool_call>'


def split_reasoning(text: str, open_tag: str = "<think>", close_tag: str = "</think>") -> tuple[str | None, str]:
    """(reasoning, rest). A lone close tag means the prompt opened the block (e.g. Qwen3 prefills)."""
    if close_tag not in text:
        if open_tag in text:  # reasoning never closed (cut by length): all of it is reasoning
            before, _, after = text.partition(open_tag)
            return after.strip("\n"), before
        return None, text
    head, _, rest = text.partition(close_tag)
    reasoning = head.split(open_tag)[-1]
    return reasoning.strip("\n"), rest


def parse_hermes(text: str) -> tuple[str, str | None, list[RawCall]]:
    reasoning, rest = split_reasoning(text)
    calls = []
    for m in _HERMES_CALL.finditer(rest):
        if not m.group(0).endswith("</tool_call>"):
            calls.append(RawCall("", "", f"a <tool_call> was not closed with </tool_call>; write {_HERMES_EXAMPLE}"))
            continue
        calls.append(call_from_json(m.group(1), ("arguments", "parameters"), _HERMES_EXAMPLE))
    content = _HERMES_CALL.sub("", rest).strip()
    return content, reasoning, calls


# ---------------------------------------------------------------- llama 3.x JSON

_LLAMA_EXAMPLE = '{"name": "<tool name>", "parameters": {...}}'


def parse_llama3(text: str) -> tuple[str, str | None, list[RawCall]]:
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>") :].strip()
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


# ---------------------------------------------------------------- harmony (gpt-oss)

_HARMONY_MSG = re.compile(
    r"(?:<\|start\|>)?(?P<header>[^<]*(?:<\|channel\|>[^<]*)?(?:<\|constrain\|>[^<]*)?)<\|message\|>"
    r"(?P<body>.*?)(?P<end><\|end\|>|<\|call\|>|<\|return\|>|\Z)",
    re.DOTALL,
)
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=<|\s|$)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_HARMONY_EXAMPLE = "<|channel|>commentary to=functions.<tool name> <|constrain|>json<|message|>{...}<|call|>"


def parse_harmony(text: str) -> tuple[str, str | None, list[RawCall]]:
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[RawCall] = []
    for m in _HARMONY_MSG.finditer(text):
        header, body = m.group("header"), m.group("body")
        channel_match = _CHANNEL.search(header)
        channel = channel_match.group(1) if channel_match else ""
        recipient_match = _RECIPIENT.search(header)
        if recipient_match:
            name = recipient_match.group(1)
            name = name[len("functions.") :] if name.startswith("functions.") else name
            if m.group("end") != "<|call|>":
                calls.append(RawCall(name, "", f"the call to {name} did not end with <|call|>; write {_HARMONY_EXAMPLE}"))
                continue
            try:
                value = json.loads(body)
            except (ValueError, RecursionError) as e:
                calls.append(
                    RawCall(name, "", f"the arguments are not valid JSON ({e}): {_short(body)}; write {_HARMONY_EXAMPLE}")
                )
                continue
            if not isinstance(value, dict):
                calls.append(RawCall(name, "", f"the arguments must be a JSON object, got {_short(body)}"))
                continue
            calls.append(RawCall(name, body.strip(), None))
        elif channel == "analysis":
            reasoning.append(body)
        else:
            content.append(body)
    return "".join(content).strip(), ("\n".join(reasoning) if reasoning else None), calls


PARSERS = {"hermes": parse_hermes, "llama3": parse_llama3, "harmony": parse_harmony}
