"""Data passed between the rendering layer and the service."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ParsedToolCall:
    """One tool call as the model wrote it.

    ``arguments`` is the JSON text of the arguments exactly as written (for formats that
    carry JSON), so the environment validates what the model produced. ``error`` is set for
    malformed calls (bad JSON, missing name...): the server does not run them and answers
    with a tool message that tells the model what was wrong.
    """

    id: str
    name: str
    arguments: str
    error: str | None = None


@dataclass
class ParsedCompletion:
    text: str  # the whole completion decoded, special tokens included
    content: str  # visible answer text (tool-call markup and reasoning removed)
    reasoning: str | None  # thinking / analysis text, where the format has it
    tool_calls: list[ParsedToolCall] = field(default_factory=list)
    stopped: bool = False  # the completion ends with one of the context's stop tokens


@dataclass
class SuffixResult:
    ids: list[int]  # tool-result turn(s) + next assistant header; empty on overflow
    truncated: bool  # some tool output was cut to fit max_suffix_tokens
    overflow: bool  # not even the minimal suffix fits; ids is empty
    tool_messages: list[dict]  # the tool messages as rendered (cut ones included)
    removed_tokens: int = 0  # tool-output tokens removed by the budget cut
