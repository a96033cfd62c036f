"""What registration decides about a template: its family rules, found by trial renders, never by name.

``FamilyRules`` is the outcome of the registration probe (probe.py): the wire format the template
writes calls in, the tokens that end an assistant turn (derived from the template's own renders),
which of them ends a turn that calls tools (the boundary), whether that token is also the first
token of the tool turn, and how synthetic messages must look for the template to render them
(``MessageStyle``). The suffix algorithm itself is generic (context.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tito.types import call_id


def tito_id(seq: int, index: int, name: str, calls_before: int) -> str:
    return call_id(seq, index)


def alnum9_id(seq: int, index: int, name: str, calls_before: int) -> str:
    """A 9-character alphanumeric call id (Mistral's templates refuse any other), unique per step and call."""
    return f"c{seq % 10**5:05d}x{index % 100:02d}"


def kimi_id(seq: int, index: int, name: str, calls_before: int) -> str:
    """Moonshot's form ``functions.NAME:IDX``, IDX counting the conversation's calls from 0: Kimi K2's templates
    write the id in place of the name, and its parsers (vLLM's kimi_k2, ours) read the name back from it."""
    return f"functions.{name or NO_NAME}:{calls_before + index}"


NO_NAME = "invalid_tool_call"  # the name a call that names no tool is rendered with
ID_STYLES = {"tito": tito_id, "alnum9": alnum9_id, "kimi": kimi_id}


@dataclass(frozen=True)
class MessageStyle:
    """How messages must look for this template to render them (found by trial renders)."""

    json_args: bool = False  # tool-call arguments as JSON text, not a mapping (DeepSeek V3 concatenates them)
    content_none: bool = False  # an assistant turn with calls has content None, not "" (no trl template)
    system: bool = False  # the template refuses a conversation without a system message
    ids: str = "tito"  # key of ID_STYLES: how tito makes the call ids the template renders
    reasoning_field: str | None = None  # the message field the template reads reasoning from
    # The synthetic call turn carries reasoning: without it the template renders the turn
    # differently once it is no longer last (Qwen3 drops an empty thinking block).
    reasoning_in_synthetic: bool = False
    # The synthetic conversations carry one tool (messages.SYNTHETIC_TOOLS): without tools the template renders the
    # conversation otherwise when a generation prompt follows (MUSE Glimmer's system turn).
    tools_in_synthetic: bool = False
    # The synthetic conversations open with a system message, for the same reason: a template that writes its system
    # turn only with tools or a generation prompt (MUSE Glimmer) writes one always when there is a system message,
    # which renders in a third of the time of one tool's definition. Tried before tools_in_synthetic.
    system_in_synthetic: bool = False

    def call_id(self, seq: int, index: int, name: str = "", calls_before: int = 0) -> str:
        """The id tito gives the ``index``-th call of step ``seq`` (to tool ``name``, after ``calls_before`` calls in
        the session) where the model wrote none, or one the template refuses."""
        return ID_STYLES[self.ids](seq, index, name, calls_before)

    def written_id_or_ours(self, written: str, seq: int, index: int, taken: set[str], name: str = "",
                           calls_before: int = 0) -> str:
        """The call id the model wrote (Mistral's, Kimi's), so tool results answer it; ours where it wrote none,
        one the template refuses (Mistral's are 9 letters or digits), or one an earlier call of the turn has."""
        fits = written and (self.ids != "alnum9" or (written.isalnum() and len(written) == 9))
        return written if fits and written not in taken else self.call_id(seq, index, name, calls_before)


@dataclass(frozen=True)
class FamilyRules:
    name: str  # label for humans and RegisterTokenizerResponse.template_family
    wire: str  # key of parsing.formats()
    stop_tokens: tuple[str, ...]  # generation stops on these (boundary first)
    boundary: str  # the token that ends an assistant turn that calls tools
    answer_end: str = ""  # the token that ends an answer (GLM writes none: the next role token, <|user|>)
    # The template writes the boundary only with the tool turn (GLM's <|observation|>): the suffix
    # starts after the token the model already emitted, found in the render with the results.
    overlap: bool = False
    # Tools run only when a completion ends with the boundary: it differs from the token that ends
    # an answer (GLM, Gemma 4, gpt-oss), so a turn ended otherwise ended the conversation.
    calls_need_boundary: bool = False
    opens_results: bool = False  # the boundary is the tool turn's first token (for reports)
    # The call turn renders otherwise once results follow (Nemotron Nano 2): the suffix starts after the boundary as
    # the template writes past turns, found in a render with the results, not in the call turn's own render.
    rerenders_call_turn: bool = False
    # The boundary also closes the calls (Apertus' <|tools_suffix|>): the parser reads the completion with it.
    boundary_closes_calls: bool = False
    reasoning_tags: tuple[str, str] | None = None  # (open, close) around reasoning in a completion
    reasoning_prefilled: bool = False  # the generation prompt already opened the reasoning block
    max_calls_per_turn: int | None = None  # the template renders at most this many calls per message
    # String values the template's writing reads back as other values (carry.py): such calls get an error.
    uncarried: tuple[str, ...] = ()
    style: MessageStyle = field(default_factory=MessageStyle)
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = [f"family {self.name}", f"wire format {self.wire}", f"stops {', '.join(self.stop_tokens)}",
                 f"call turns end with {self.boundary}" + (" (it also opens the tool results)" if self.opens_results
                                                            else "")]
        if self.max_calls_per_turn:
            parts.append(f"at most {self.max_calls_per_turn} call per turn")
        if self.style.json_args:
            parts.append("arguments as JSON text")
        return "; ".join(parts)
