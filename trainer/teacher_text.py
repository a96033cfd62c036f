"""The text a scripted teacher writes (tool calls in the Hermes/Qwen format) and the encode/decode callables tasks
take: shared by the tasks (`tasks.py`, `reasoning_gym_task.py`) without one importing the other."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Decode = Callable[[list[int]], str]
Encode = Callable[[str], list[int]]


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """A Hermes/Qwen tool call, ended by the turn's stop token."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call><|im_end|>"


def tool_call_text(code: str) -> str:
    """A Hermes/Qwen tool call of `run_python`, ended by the turn's stop token."""
    return call_text("run_python", {"code": code})
