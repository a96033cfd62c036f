"""The harmony wire format (gpt-oss): ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``.

The model writes the recipient after the channel; the template writes it before
(``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>``); both are read.
A call is delimited by its stop token ``<|call|>``, so this parser gets the completion with it.
Analysis-channel text is the reasoning; final/other channels are the answer.
"""

from __future__ import annotations

import re

from .parse_json import arguments_text
from .parsing import Parsed, RawCall, WireFormat
from .values import ToolIndex

_HARMONY_MSG = re.compile(
    r"(?:<\|start\|>)?(?P<header>[^<]*(?:<\|channel\|>[^<]*)?(?:<\|constrain\|>[^<]*)?)<\|message\|>"
    r"(?P<body>.*?)(?P<end><\|end\|>|<\|call\|>|<\|return\|>|\Z)",
    re.DOTALL,
)
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=<|\s|$)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_EXAMPLE = "<|channel|>commentary to=functions.<tool name> <|constrain|>json<|message|>{...}<|call|>"


def parse_harmony(text: str, tools: ToolIndex | None = None) -> Parsed:
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[RawCall] = []
    for m in _HARMONY_MSG.finditer(text):
        header, body = m.group("header"), m.group("body")
        channel_match = _CHANNEL.search(header)
        channel = channel_match.group(1) if channel_match else ""
        recipient_match = _RECIPIENT.search(header)
        if recipient_match:
            name = recipient_match.group(1).removeprefix("functions.")
            if m.group("end") != "<|call|>":
                calls.append(RawCall(name, "", f"the call to {name} did not end with <|call|>; write {_EXAMPLE}"))
                continue
            arguments, error = arguments_text(name, body, tools, _EXAMPLE)
            calls.append(RawCall(name, arguments, error))
        elif channel == "analysis":
            reasoning.append(body)
        else:
            content.append(body)
    return "".join(content).strip(), ("\n".join(reasoning) if reasoning else None), calls


FORMATS = (WireFormat("harmony", parse_harmony, _EXAMPLE, "gptoss", delimited_by_stop=True),)
