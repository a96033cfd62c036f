"""Data passed between the rendering layer and the service."""

from __future__ import annotations

from dataclasses import dataclass, field

from tito.types import Message, ToolCall


@dataclass
class ParsedCompletion:
    text: str  # the whole completion decoded, special tokens included
    content: str  # visible answer text (tool-call markup and reasoning removed)
    reasoning: str | None  # thinking / analysis text, where the format has it
    # Malformed calls carry `error` (not run; the model is told why).
    tool_calls: list[ToolCall] = field(default_factory=list)
    stopped: bool = False  # the completion ends with one of the context's stop tokens
    # What the parser read as the deployment parser reads it though the grammar does not allow it ("call 1
    # (run_python): closed <tool_call> with </tool_call> at the end of the output"); empty when strict.
    repairs: list[str] = field(default_factory=list)


@dataclass
class SuffixResult:
    ids: list[int]  # tool-result turn(s) + next assistant header; empty on overflow
    truncated: bool  # some tool output was cut to fit max_suffix_tokens
    overflow: bool  # not even the minimal suffix fits; ids is empty
    tool_messages: tuple[Message, ...]  # the tool messages as rendered (cut ones included)
    removed_tokens: int = 0  # tool-output tokens removed by the budget cut
