"""Messages as a template reads them, shaped by the template's ``MessageStyle``.

One place builds the assistant call turn and the tool messages for the registration probe, the
golden check and the per-step suffix, so all three render exactly the same shapes: tool
messages always carry the tool's ``name`` and the call's ``tool_call_id`` (Gemma 4 matches
results to calls by id, gpt-oss names the tool turn), calls always carry ``type: "function"``
(DeepSeek V3 reads it), and arguments are a mapping or JSON text as the template needs.
`template_message` is the one conversion of a `tito.types.Message` into that dict form.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from tito.types import Message, Role, ToolCall

from .families import MessageStyle

SYSTEM = {"role": "system", "content": "You are a careful assistant."}
SYNTHETIC_USER = {"role": "user", "content": "."}
SYNTHETIC_REASONING = "Calling the tools."
# The tools of synthetic conversations, for templates that render a conversation otherwise without tools.
SYNTHETIC_TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.", "parameters": {
    "type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]


def synthetic_tools(style: MessageStyle) -> list[dict] | None:
    return SYNTHETIC_TOOLS if style.tools_in_synthetic else None


def head(style: MessageStyle, user: Mapping[str, Any] = SYNTHETIC_USER) -> list[dict]:
    return ([dict(SYSTEM)] if style.system else []) + [dict(user)]


def synthetic_head(style: MessageStyle) -> list[dict]:
    """The opening of tito's synthetic conversations (the probe's and the suffix's)."""
    return ([dict(SYSTEM)] if style.system_in_synthetic and not style.system else []) + head(style)


def _arguments(style: MessageStyle, args: Any) -> Any:
    if style.json_args:
        return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    if isinstance(args, str):
        try:
            value = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return args
        return value if isinstance(value, dict) else args
    return args


def call_entry(style: MessageStyle, call_id: str, name: str, args: Any) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": _arguments(style, args)}}


def assistant(style: MessageStyle, calls: Sequence[tuple[str, str, Any]], reasoning: str | None = None,
              content: str = "") -> dict:
    """An assistant turn calling ``(id, name, arguments)`` in order."""
    msg: dict[str, Any] = {"role": "assistant", "content": None if style.content_none and not content else content}
    if calls:
        msg["tool_calls"] = [call_entry(style, i, n, a) for i, n, a in calls]
    if reasoning is not None and style.reasoning_field:
        msg[style.reasoning_field] = reasoning
    return msg


def tool(name: str, call_id: str, content: str) -> dict:
    return {"role": "tool", "content": content, "name": name, "tool_call_id": call_id}


def tool_group(tool_calls: Sequence[ToolCall], tool_messages: Sequence[Message]) -> tuple[Message, ...]:
    """The tool messages of one step, each with its call's tool name and id where it has none."""
    out = []
    for i, m in enumerate(tool_messages):
        call = tool_calls[i] if i < len(tool_calls) else None
        out.append(Message(role=Role.TOOL, content=m.content, name=m.name or (call.name if call else ""),
                           tool_call_id=m.tool_call_id or (call.id if call else "")))
    return tuple(out)


def template_message(m: Message, style: MessageStyle) -> dict:
    """A message in this template's dict form: the one conversion from `tito.types.Message`.

    Raises ValueError when an assistant turn's call arguments are not a JSON object (a template
    would render them wrongly or not at all)."""
    if m.role is Role.TOOL:
        return tool(m.name, m.tool_call_id, m.content)
    if m.role is not Role.ASSISTANT or not (m.tool_calls or m.reasoning_content):
        return {"role": str(m.role), "content": m.content}
    calls = []
    for j, c in enumerate(m.tool_calls):
        try:
            args = json.loads(c.arguments) if c.arguments.strip() else {}
        except (ValueError, RecursionError) as e:
            raise ValueError(f"tool_calls[{j}].arguments is not valid JSON ({e})") from None
        if not isinstance(args, dict):
            raise ValueError(f"tool_calls[{j}].arguments must be a JSON object")
        calls.append((c.id, c.name, args))
    msg = assistant(style, calls, m.reasoning_content or None, m.content)
    if m.reasoning_content and not style.reasoning_field:
        msg["reasoning_content"] = m.reasoning_content  # the template may still read it under this name
    return msg


_DROP_EMPTY = ("tool_calls", "reasoning_content", "name", "tool_call_id")


def normalize(messages: Sequence[Mapping[str, Any]], style: MessageStyle) -> list[dict]:
    """A client's conversation in this template's shapes (arguments as mapping or JSON text, empty fields dropped)."""
    out = []
    for m in messages:
        m = {k: v for k, v in copy.deepcopy(dict(m)).items() if not (k in _DROP_EMPTY and not v)}
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c.get("function") or {"name": c.get("name"), "arguments": c.get("arguments")})
                calls.append(call_entry(style, c.get("id"), fn.get("name"), fn.get("arguments")))
            m["tool_calls"] = calls
            if style.content_none and not m.get("content"):
                m["content"] = None
        out.append(m)
    return out
