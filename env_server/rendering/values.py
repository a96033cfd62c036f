"""Argument values typed by the tool's JSON Schema, for every wire format.

Formats that are not JSON carry no types: ``<parameter=days>\\n3\\n</parameter>`` is the integer 3
for ``days: integer`` and the string "3" for ``zip: string``. The session's tools are known when
a completion is parsed, so each value is typed by its parameter's schema, as the model meant it:
- ``string`` keeps the text exactly (a string is never altered): ``null`` written for a string
  parameter is the string "null", as vLLM's parsers read it, unless the schema also allows null;
- ``null`` is null where the schema allows null (``"null"`` among its types) or the parameter is not a
  string (JSON's null, what vLLM's fallback reads); ``None`` where the schema allows null or the
  parameter is optional and not a string: models write it for an optional parameter they leave unset;
- ``integer``/``number``/``boolean`` are converted (``3.0`` is the integer 3; ``True``/``true``);
- ``object``/``array`` accept JSON, a Python literal (``{'a': True}``, what ``str(dict)`` writes and
  what Seed-OSS's template renders), and JSON encoded twice (``"{\\"a\\": 1}"``).
A value that does not cast (``days: seven``), and a parameter the schema does not describe, keep
the text: the environment validates the arguments and tells the model what was wrong. JSON
formats keep the arguments text as written unless a value's JSON type is not the schema's and a
cast fixes it (``"days": "3"``, ``"filter": null`` for an optional string stays as written).
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Param:
    types: tuple[str, ...]  # the declared JSON Schema types, unions flattened
    required: bool


class ToolParams(dict):
    """A tool's declared parameters (name -> Param, in declaration order) and whether its schema allows others
    (JSON Schema's ``additionalProperties`` is true unless the schema says false)."""

    def __init__(self, params: Mapping[str, Param], additional: bool = True) -> None:
        super().__init__(params)
        self.additional = additional


# tool name -> its parameters
ToolIndex = Mapping[str, Mapping[str, Param]]


def allows_more(params: Mapping[str, Param] | None) -> bool:
    """Whether a tool takes parameters it does not declare (True for a tool the schema does not describe)."""
    return params is None or getattr(params, "additional", True)

_NULLS = ("null", "None")


def _schema_types(schema: Any) -> tuple[str, ...]:
    if not isinstance(schema, Mapping):
        return ()
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else [t for t in declared or () if isinstance(t, str)]
    for union in ("anyOf", "oneOf"):
        for choice in schema.get(union) or ():
            types.extend(_schema_types(choice))
    if schema.get("nullable") and "null" not in types:
        types.append("null")
    return tuple(types)


def tool_index(tools: Iterable[Any] | None) -> dict[str, ToolParams]:
    """Index OpenAI-style tool specs (dicts, or objects with ``openai_spec()``) by name and parameter."""
    out: dict[str, dict[str, Param]] = {}
    for tool in tools or ():
        spec = tool.openai_spec() if hasattr(tool, "openai_spec") else tool
        fn = spec.get("function", spec) if isinstance(spec, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters") or {}
        props = params.get("properties") if isinstance(params, Mapping) else None
        required = set(params.get("required") or ()) if isinstance(params, Mapping) else set()
        out[fn["name"]] = ToolParams(
            {k: Param(_schema_types(v), k in required) for k, v in (props or {}).items() if isinstance(k, str)},
            additional=not (isinstance(params, Mapping) and params.get("additionalProperties") is False))
    return out


def param_of(tools: ToolIndex | None, tool: str, param: str) -> Param | None:
    return (tools or {}).get(tool, {}).get(param)


def _container(raw: str, kind: type) -> Any:
    """``raw`` as a dict/list: JSON, a Python literal, or JSON encoded twice; None if it is none of these."""
    value: Any = raw
    for _ in range(2):  # the second round undoes a second encoding
        text = value.strip()
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            try:
                value = ast.literal_eval(text)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
        if isinstance(value, kind):
            return value
        if not isinstance(value, str):
            return None
    return None


def cast(raw: str, param: Param) -> Any:
    """The text ``raw`` as the parameter's type; the text itself when it does not cast."""
    text = raw.strip()
    if text in _NULLS and _null_here(text, param):
        return None
    for name in param.types:
        if name == "string":
            return raw
        if name == "integer":
            try:
                return int(text)
            except ValueError:
                try:
                    number = float(text)
                except ValueError:
                    continue
                if number.is_integer():
                    return int(number)
        elif name == "number":
            try:
                number = float(text)
            except ValueError:
                continue
            if math.isfinite(number):
                return int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number
        elif name == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        elif name in ("object", "array"):
            value = _container(raw, dict if name == "object" else list)
            if value is not None:
                return value
    return raw


def _null_here(text: str, param: Param) -> bool:
    """Whether the written ``null``/``None`` is null for this parameter (else it stays text)."""
    if "null" in param.types:
        return True
    if "string" in param.types:
        return False
    return text == "null" or not param.required


def typed_value(tools: ToolIndex | None, tool: str, param: str, raw: str) -> Any:
    """``raw`` typed by the schema of ``tool``'s ``param``; the text when the schema says nothing."""
    spec = param_of(tools, tool, param)
    return raw if spec is None or not spec.types else cast(raw, spec)


def retype(tools: ToolIndex | None, tool: str, param: str, value: Any) -> Any:
    """A value read from JSON or a Python literal, retyped where its type is not the schema's and a cast
    fixes it: a quoted number (``days='3'``), an object encoded as a string, a written-out null."""
    spec = param_of(tools, tool, param)
    if spec is None or not spec.types or not isinstance(value, str) or "string" in spec.types[:1]:
        return value  # a quoted string where the schema wants one is never altered
    return cast(value, spec)


def arguments_json(arguments: Mapping[str, Any]) -> str:
    """The JSON text of typed arguments, as chat templates' ``tojson`` writes it (non-ASCII kept)."""
    return json.dumps(dict(arguments), ensure_ascii=False)
