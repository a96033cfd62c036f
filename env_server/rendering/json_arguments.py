"""The arguments object of a call, read from JSON text: as written, retyped only where the tool's schema says so.

Shared by every reader whose calls carry JSON arguments (parse_json.py, parse_named.py, parse_harmony.py).
"""

from __future__ import annotations

import json
from typing import Any

from .calls import _DECODER, json_object_spans, short
from .values import ToolIndex, arguments_json, retype


def _not_json(text: str, pos: int, error: Exception) -> str:
    msg = error.msg if isinstance(error, json.JSONDecodeError) else "nested too deeply"
    at = error.pos - pos if isinstance(error, json.JSONDecodeError) else 0
    return f"the tool call is not valid JSON ({msg} at char {at}): {short(text[pos:].strip())}"


def decode_value(text: str, pos: int) -> tuple[Any, int]:
    """One JSON value at ``pos``: (value, end). Raises ValueError with a message for the model."""
    try:
        return _DECODER.raw_decode(text, pos)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ValueError(_not_json(text, pos, e)) from None


def typed_arguments(name: str, fields: dict[str, tuple[Any, str]], raw: str, tools: ToolIndex | None) -> str:
    """The arguments text: as written, unless the schema retypes a value (``"days": "3"`` for an integer)."""
    values = {k: v for k, (v, _) in fields.items()}
    typed = {k: retype(tools, name, k, v) for k, v in values.items()}
    return raw if typed == values and all(type(typed[k]) is type(values[k]) for k in typed) else arguments_json(typed)


def arguments_text(name: str, raw: str, tools: ToolIndex | None, example: str) -> tuple[str, str | None]:
    """(arguments, error) from the JSON text of an arguments object (or a JSON string holding one)."""
    text = raw.strip()
    try:
        fields = json_object_spans(text)
    except ValueError as e:
        try:  # the object encoded a second time, as a JSON string
            inner = json.loads(text)
            fields, text = json_object_spans(inner), inner
        except (ValueError, TypeError, RecursionError):
            return "", f"the arguments of {name or 'the call'} are not valid JSON ({e}): {short(text)}; write {example}"
    return typed_arguments(name, fields, text, tools), None
