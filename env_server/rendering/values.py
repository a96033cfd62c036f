"""Argument values written as raw text (XML parameters, GLM arg_value, pythonic strings), typed by the tool's schema.

Formats that are not JSON carry no types: ``<parameter=days>\\n3\\n</parameter>`` is the integer 3
for ``days: integer`` and the string "3" for ``zip: string``. The session's tools are known when
a completion is parsed, so each value is typed by its parameter's JSON Schema, as the model
meant it: ``string`` keeps the text, ``integer``/``number``/``boolean``/``null`` and
``object``/``array`` (JSON) are parsed. The cast rules are transformers' own
(``chat_parsing.response_parser._coerce``, what ``parse_response(tools=...)`` applies), so our
typing agrees with theirs; a value that does not cast (``days: seven``), and a parameter the
schema does not describe, keep the text: the environment validates the arguments and tells
the model what was wrong.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from transformers.utils.chat_parsing.response_parser import _coerce, _schema_types

# name -> parameter -> declared JSON Schema types
ToolIndex = Mapping[str, Mapping[str, tuple[str, ...]]]


def tool_index(tools: Iterable[Any] | None) -> dict[str, dict[str, tuple[str, ...]]]:
    """Index OpenAI-style tool specs (dicts, or objects with ``openai_spec()``) by name and parameter."""
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for tool in tools or ():
        spec = tool.openai_spec() if hasattr(tool, "openai_spec") else tool
        fn = spec.get("function", spec) if isinstance(spec, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters") or {}
        props = params.get("properties") if isinstance(params, Mapping) else None
        out[fn["name"]] = {k: _schema_types(v) for k, v in (props or {}).items() if isinstance(k, str)}
    return out


def typed_value(tools: ToolIndex | None, tool: str, param: str, raw: str) -> Any:
    """``raw`` typed by the schema of ``tool``'s ``param``; text when the schema says string or says nothing."""
    types = (tools or {}).get(tool, {}).get(param, ())
    if not types or "string" in types[:1]:
        return raw
    try:
        return _coerce(raw, types)
    except RecursionError:  # JSON nested thousands deep: the environment sees the text and says why
        return raw


def retype_literal(tools: ToolIndex | None, tool: str, param: str, value: Any) -> Any:
    """A value the model wrote as a string literal where the schema wants another type (``days='3'``)."""
    return typed_value(tools, tool, param, value) if isinstance(value, str) else value


def arguments_json(arguments: Mapping[str, Any]) -> str:
    """The JSON text of typed arguments, as chat templates' ``tojson`` writes it (non-ASCII kept)."""
    return json.dumps(dict(arguments), ensure_ascii=False)
