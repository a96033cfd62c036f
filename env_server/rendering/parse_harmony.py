"""The harmony wire format (gpt-oss): ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``.

The model writes the recipient after the channel; the template writes it before
(``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>``); both are read.
A call's arguments are read by the JSON decoder (so ``<|end|>`` inside a string value is text) and
end with the stop token ``<|call|>``, so this parser gets the completion with it. Analysis-channel
text is the reasoning; final/other channels are the answer.
"""

from __future__ import annotations

import re

from .calls import _DECODER, _WS, Parsed, RawCall, WireFormat, short
from .json_arguments import arguments_text
from .values import ToolIndex

_HEADER = re.compile(
    r"(?:<\|start\|>)?(?P<header>[^<]*(?:<\|channel\|>[^<]*)?(?:<\|constrain\|>[^<]*)?)<\|message\|>")
_BODY_END = re.compile(r"<\|end\|>|<\|call\|>|<\|return\|>|\Z")
_CALL = "<|call|>"
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=<|\s|$)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_EXAMPLE = "<|channel|>commentary to=functions.<tool name> <|constrain|>json<|message|>{...}<|call|>"


def _call(name: str, text: str, at: int, tools: ToolIndex | None) -> tuple[RawCall, int]:
    """The call whose JSON body starts at ``at``: (call, where the message ends)."""
    try:
        _, end = _DECODER.raw_decode(text, _WS.match(text, at).end())
    except (ValueError, RecursionError):
        end = -1
    after = _WS.match(text, end).end() if end >= 0 else -1
    if end >= 0 and text.startswith(_CALL, after):
        arguments, error = arguments_text(name, text[at:end], tools, _EXAMPLE)
        return RawCall(name, arguments, error), after + len(_CALL)
    stop = _BODY_END.search(text, at)
    if stop[0] != _CALL:
        return RawCall(name, "", f"the call to {name} did not end with {_CALL}; write {_EXAMPLE}"), stop.end()
    _, error = arguments_text(name, text[at:stop.start()], tools, _EXAMPLE)
    return RawCall(name, "", error or f"unexpected text after the arguments of {name}: "
                                      f"{short(text[end:stop.start()], 60)!r}; write {_EXAMPLE}"), stop.end()


def parse_harmony(text: str, tools: ToolIndex | None = None, strict: bool = False) -> Parsed:
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[RawCall] = []
    pos = 0
    while (m := _HEADER.search(text, pos)) is not None:
        header = m["header"]
        recipient = _RECIPIENT.search(header)
        if recipient:
            call, pos = _call(recipient[1].removeprefix("functions."), text, m.end(), tools)
            calls.append(call)
            continue
        stop = _BODY_END.search(text, m.end())
        channel = _CHANNEL.search(header)
        (reasoning if channel and channel[1] == "analysis" else content).append(text[m.end():stop.start()])
        pos = max(stop.end(), m.end() + 1) if stop.end() > stop.start() else len(text)
    return "".join(content).strip(), ("\n".join(reasoning) if reasoning else None), calls


FORMATS = (WireFormat("harmony", parse_harmony, _EXAMPLE, "gptoss", delimited_by_stop=True),)
