"""RenderingContext: prompt ids, completion parsing and suffix ids for one registered tokenizer.

Suffix algorithm (docs/architecture.md, the brief's "Rendering", REPORT.md §5): render a short
synthetic conversation ending in an assistant turn that calls the same tools (real names; real
ids where the template shows them; reasoning where the template needs it), then the same plus
the whole tool group with the generation prompt. The model's turn ends with the boundary token
(rules.boundary, the token it stopped on), so the suffix is the second render after that token:
after its last occurrence in the first render, or (overlap: the template writes the token only
with the results, GLM's <|observation|>) right after it in the second render, so the token the
model already emitted is not repeated. Added tokens are split off before pre-tokenization, so
tokenizing the suffix text alone gives exactly the ids the template's full render has there.
If the second render does not start with the first up to the cut, the template rewrote earlier
text and we refuse loudly (SuffixRenderError); a cached first render is rendered again once before that
(a template that writes today's date renders another one after midnight).

Where later rounds render otherwise, synthetic earlier rounds come first: one for DeepSeek V3's
template, as many calls as the conversation has had for templates that number calls (llama.cpp's Kimi
K2 copies). For those, rather than rendering every earlier call at each Step, the results are rendered
exactly after no earlier call and, where the template wrote each output as it is, the outputs go into
the slots of a render after as many calls made once per shape with placeholder outputs
(numbered_calls.py: `_counted_suffix`; checked at registration, `_counts_by_substitution`, and by a whole render of the first
and every AUDIT_EVERY-th substituted suffix, `_audited`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jinja2.exceptions import TemplateError

from tito.types import Message, ToolCall, ToolSpec

from . import carry
from . import messages as msgs
from .budget import fit
from .errors import SuffixRenderError
from .families import NO_NAME, FamilyRules
from .numbered_calls import _CACHE_LIMIT, _PLACEHOLDER, AUDIT_EVERY, NumberedCallSuffixes
from .calls import RawCall, split_reasoning
from .parsing import formats
from .template import ChatTemplate
from .types import ParsedCompletion, SuffixResult
from .values import tool_index

log = logging.getLogger(__name__)

@dataclass(eq=False)
class RenderingContext(NumberedCallSuffixes):
    fingerprint: str
    rules: FamilyRules
    template: ChatTemplate
    renderer_version: str
    quirks: list[str] = field(default_factory=list)  # found by the golden check, for logs

    def __post_init__(self) -> None:
        t = self.template
        self.stop_token_ids = [t.token_id(s) for s in self.rules.stop_tokens]
        self._stop_set = frozenset(self.stop_token_ids)
        self._stop_text = {i: t.decode([i]) for i in self._stop_set if i is not None}
        self._boundary_id = t.token_id(self.rules.boundary)
        self._wire = formats()[self.rules.wire]
        self._head = msgs.synthetic_head(self.rules.style)
        self._reasoning = msgs.SYNTHETIC_REASONING if self.rules.style.reasoning_in_synthetic else None
        self._tools = msgs.synthetic_tools(self.rules.style)
        self._ids_matter = self._template_reads_ids()
        self._turns: dict[tuple, tuple] = {}  # (names, ids, earlier calls) -> (synthetic conversation, prefix, ids)
        self._index_of: tuple[Any, dict] = (None, {})
        self._slots: dict[tuple, tuple[str, ...] | None] = {}  # shape -> suffix split at placeholder outputs
        self._substituted = itertools.count()  # substituted suffixes so far (next() is atomic under the GIL)
        self._lock = threading.Lock()
        self.counted_by_substitution = False  # the probes below render whole conversations
        self.rounds_differ = self._rounds_differ()
        self.counts_calls = self._counts_calls()
        self.counted_by_substitution = self._counts_by_substitution()

    @property
    def family(self) -> str:
        return self.rules.name

    @property
    def tokenizer(self) -> Any:
        return self.template.tokenizer

    @property
    def chat_template_kwargs(self) -> dict[str, Any]:
        return self.template.kwargs

    # ------------------------------------------------------------ rendering

    def render_text(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool) -> str:
        return self.template.render(messages, tools, add_generation_prompt)

    def sanitize(self, obj: Any) -> Any:
        return self.template.sanitize(obj)

    def encode(self, text: str) -> list[int]:
        return self.template.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.template.decode(ids)

    def render_conversation(self, messages: list[dict], tools: list[dict] | None = None,
                            add_generation_prompt: bool = False) -> list[int]:
        """The template's own token ids for a whole conversation (sanitized, in this template's shapes)."""
        conv = self.sanitize(msgs.normalize(messages, self.rules.style))
        return self.encode(self.render_text(conv, self.sanitize(tools), add_generation_prompt))

    def render_prompt(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> list[int]:
        """The opening conversation with the tools and the generation prompt. Raises ValueError for a
        conversation the client got wrong (empty, call arguments that are not a JSON object)."""
        if not messages:
            raise ValueError("the opening conversation is empty: send at least one user message")
        conv = []
        for i, m in enumerate(messages):
            try:
                conv.append(msgs.template_message(m, self.rules.style))
            except ValueError as e:
                raise ValueError(f"messages[{i}].{e}") from None
        specs = [t.openai_spec() for t in tools]
        return self.encode(self.render_text(self.sanitize(conv), self.sanitize(specs), True))

    # ------------------------------------------------------------ completion

    def parse_completion(self, completion_ids: list[int], seq: int = 0,
                         tools: Sequence[ToolSpec] | Sequence[dict] | None = None,
                         calls_before: int = 0, strict: bool = False) -> ParsedCompletion:
        """Decode an assistant turn (the answer to Step ``seq``) and parse its tool calls.

        ``tools``: the session's tool specs (the registration check passes its probe tools as the
        OpenAI-style dicts it renders); they type the values of formats that write raw text (XML
        parameters, GLM, pythonic). ``calls_before``: the calls of the conversation so far (Kimi's call
        ids count them). ``strict``: outputs the deployment parser reads leniently (parsing.py) are errors."""
        vocab = self.template.vocab_size
        if completion_ids and not (set(map(type, completion_ids)) == {int}  # one C-speed pass for the common case
                                   and min(completion_ids) >= 0 and max(completion_ids) < vocab):
            for i in completion_ids:
                if not isinstance(i, int) or not 0 <= i < vocab:
                    raise ValueError(f"token id {i!r} is outside this tokenizer's vocabulary (0..{vocab - 1})")
        rules = self.rules
        stopped = bool(completion_ids) and completion_ids[-1] in self._stop_set
        on_boundary = stopped and completion_ids[-1] == self._boundary_id
        text = self.decode(list(completion_ids))
        body = text
        keep_stop = self._wire.delimited_by_stop or (rules.boundary_closes_calls and on_boundary)
        if stopped and not keep_stop:
            stop = self._stop_text[completion_ids[-1]]
            body = text[: len(text) - len(stop)] if text.endswith(stop) else self.decode(list(completion_ids[:-1]))
        reasoning = None
        if rules.reasoning_tags and not self._wire.delimited_by_stop:
            reasoning, body = split_reasoning(body, *rules.reasoning_tags, prefilled=rules.reasoning_prefilled)
        try:
            content, own_reasoning, raw = self._wire.parse(body, self._tool_index(tools), strict)
        except Exception as e:  # a parser bug must cost the model one error result, never the step
            log.exception("the %s parser failed on a completion", rules.wire)
            content, own_reasoning = body, None
            raw = [RawCall("", "", f"the tool calls could not be read ({type(e).__name__}); write {self._wire.example}")]
        if rules.calls_need_boundary and stopped and not on_boundary:
            raw = []  # the model ended the conversation (e.g. GLM <|user|>): nothing runs
        elif rules.calls_need_boundary and on_boundary and not raw:
            # The template's next token is already the tool turn: it must get a result.
            raw = [RawCall("", "", f"the turn ended with {rules.boundary}, which opens tool results, but holds no "
                                   f"tool call; write {self._wire.example}, or end your answer without calling a tool")]
        calls: list[ToolCall] = []
        for n, c in enumerate(raw):
            call_id = rules.style.written_id_or_ours(c.id, seq, n, {call.id for call in calls}, c.name, calls_before)
            calls.append(ToolCall(call_id, c.name, c.arguments, c.error))
        limit = rules.max_calls_per_turn
        if limit is not None:
            calls[limit:] = [
                c if c.error else dataclasses.replace(c, error=(
                    f"this model's chat format allows {limit} tool call per turn; this call was not run. "
                    "Make one call, wait for its result, then make the next."))
                for c in calls[limit:]
            ]
        if rules.uncarried:  # the template cannot write every value: a call it would show otherwise is not run
            calls = [c if c.error or not carry.needs_write_back(rules.uncarried, c.arguments)
                     or self._writes_back(c, tools) else dataclasses.replace(c, error=carry.error(c.name))
                     for c in calls]
        repairs = [f"call {n + 1} ({c.name}): {r}" for n, c in enumerate(raw) for r in c.repairs if not c.error]
        return ParsedCompletion(text=text, content=content, reasoning=reasoning or own_reasoning, tool_calls=calls,
                                stopped=stopped, repairs=repairs)

    def _writes_back(self, call: ToolCall, tools) -> bool:
        style, index = self.rules.style, self._tool_index(tools)

        def read(text: str) -> list:
            body = text.removesuffix(self.rules.boundary)
            if self.rules.reasoning_tags:
                _, body = split_reasoning(body, *self.rules.reasoning_tags, prefilled=self.rules.reasoning_prefilled)
            return [(c.name, json.loads(c.arguments)) for c in self._wire.parse(body, index)[2] if not c.error]

        return carry.writes_back(lambda name, args: self.completion_text(msgs.synthetic_head(style), msgs.assistant(
            style, [(call.id, name, args)]), msgs.synthetic_tools(style)), read, call.name, call.arguments)

    def _tool_index(self, tools: Iterable[Any] | None) -> dict:
        if tools is None:
            return {}
        held, index = self._index_of
        if held is not tools:  # one session's tools are one list, passed at every step
            index = tool_index(tools)
            self._index_of = (tools, index)
        return index

    # ------------------------------------------------------------ suffix

    def _template_reads_ids(self) -> bool:
        """Whether call ids show in the renders; if not, the synthetic turn uses fixed ids and is cached."""
        style = self.rules.style
        renders = []
        for seq, before in ((0, 0), (1, 7)):
            calls = [(style.call_id(seq, 0, "lookup", before), "lookup", {})]
            try:
                renders.append(self.render_text(
                    self._head + [msgs.assistant(style, calls, self._reasoning), msgs.tool("lookup", calls[0][0], "r")],
                    self._tools, True))
            except Exception:
                return True
        return renders[0] != renders[1]

    def _earlier_rounds(self, calls: int) -> list[dict]:
        """Finished tool rounds holding ``calls`` calls, for templates whose later rounds render otherwise: one turn
        with all of them where the template renders several calls per turn (fewer messages to render), else one
        round per call."""
        style = self.rules.style
        ids = [style.call_id(1, i, "lookup", 0) for i in range(calls)]
        if not ids:
            return []
        if self.rules.max_calls_per_turn is None:
            return [msgs.assistant(style, [(i, "lookup", {}) for i in ids], self._reasoning),
                    *(msgs.tool("lookup", i, "r") for i in ids)]
        return [m for i in ids for m in (msgs.assistant(style, [(i, "lookup", {})], self._reasoning),
                                         msgs.tool("lookup", i, "r"))]

    def _probe_suffix(self, earlier_calls: int) -> str:
        """The suffix of one call after ``earlier_calls`` synthetic ones (the call's own id fixed, so that only
        the earlier rounds differ)."""
        call = ToolCall(self.rules.style.call_id(0, 0, "lookup", 99), "lookup", "{}")
        return self._suffix_after([call], [msgs.tool("lookup", call.id, "r")], earlier_calls)

    def _rounds_differ(self) -> bool:
        """Whether a tool turn after an earlier round renders differently from the first one (DeepSeek V3's
        template opens the tool outputs only once per conversation). Such a template gets two suffix shapes,
        the first round's and every later one's; the golden check's three rounds verify that two suffice."""
        try:
            return self._probe_suffix(0) != self._probe_suffix(1)
        except Exception:
            return False  # the golden check reports what does not render

    def _counts_calls(self) -> bool:
        """Whether a tool turn renders otherwise after one earlier call than after two (llama.cpp's Kimi K2 Instruct
        and Thinking templates number calls across the conversation, functions.NAME:IDX, and write that number in
        each result): the suffix is then rendered after as many synthetic calls as the conversation has had."""
        try:
            return self._probe_suffix(1) != self._probe_suffix(2)
        except Exception:
            return False

    def _call_turn(self, tool_calls: Sequence[ToolCall], earlier_calls: int = 0, fresh: bool = False
                   ) -> tuple[list[dict], str, tuple[str, ...]]:
        """The synthetic conversation through a turn calling these tools (sanitized), its render through the
        boundary, and the call ids the results must carry; cached by names (and ids, where they show).
        `earlier_calls`: synthetic calls in rounds before this one (where later rounds render otherwise).
        `fresh`: render the prefix again rather than take the cached one (it may be stale: a template that writes
        today's date renders another prefix once the day has changed)."""
        style = self.rules.style
        calls = list(tool_calls)[: self.rules.max_calls_per_turn or None]
        names = tuple(c.name or NO_NAME for c in calls)
        if self._ids_matter:
            ids = tuple(c.id or style.call_id(0, i, n, earlier_calls) for i, (c, n) in enumerate(zip(calls, names)))
        else:  # fixed ids for the call turn and the results alike
            ids = tuple(style.call_id(0, i, n) for i, n in enumerate(names))
        hit = None if fresh else self._turns.get((names, ids, earlier_calls))
        if hit is not None:
            return hit
        turn = msgs.assistant(style, [(i, n, {}) for i, n in zip(ids, names)], self._reasoning)
        base = self.sanitize(self._head + self._earlier_rounds(earlier_calls) + [turn])
        prefix = self._through_boundary(base, ids, names)
        with self._lock:
            if len(self._turns) >= _CACHE_LIMIT:
                self._turns.clear()
            self._turns[(names, ids, earlier_calls)] = (base, prefix, ids)
        return base, prefix, ids

    def _through_boundary(self, base: list[dict], ids: tuple[str, ...], names: tuple[str, ...]) -> str:
        """The render of ``base`` (ending in the call turn) through the boundary the model stopped on: what every
        suffix render must start with. Where the template renders the call turn otherwise once results follow,
        it is cut from a render with placeholder results, before the first of them."""
        boundary = self.rules.boundary
        if self.rules.rerenders_call_turn:
            results = [msgs.tool(n, i, _PLACEHOLDER) for i, n in zip(ids, names)]
            text = self.render_text(base + results, self._tools, True)
            end = text.find(_PLACEHOLDER)
        else:
            text = self.render_text(base, self._tools, False)
            end = len(text)
            if self.rules.overlap:
                return text + boundary
        at = self.template.find_token(text, boundary, last=True, end=end)
        if at < 0:
            raise SuffixRenderError(
                f"the template's call turn has no {boundary} (the token a call turn ends with at registration); "
                f"it rendered {text[max(0, end - 200):end]!r}")
        return text[: at + len(boundary)]

    def earlier_calls(self, later_round: bool, calls_before: int | None) -> int:
        """How many synthetic earlier calls a suffix is rendered after: as many as the conversation has had where
        the template counts them, one where only the first round renders otherwise, else none."""
        if calls_before is None:
            calls_before = 1 if later_round else 0
        if self.counts_calls:
            return calls_before
        return 1 if calls_before and self.rounds_differ else 0

    def suffix_text(self, tool_calls: Sequence[ToolCall], tool_messages: list[dict], later_round: bool = False,
                    calls_before: int | None = None) -> str:
        """The suffix as (sanitized) template text; raises SuffixRenderError if not prefix-stable.
        `later_round`: the session has had a tool round before this one; `calls_before`: how many calls it had
        (None: one if `later_round`); they matter where `rounds_differ` or `counts_calls`."""
        return self._suffix_after(tool_calls, tool_messages, self.earlier_calls(later_round, calls_before))

    def _suffix_after(self, tool_calls: Sequence[ToolCall], tool_messages: list[dict], earlier_calls: int) -> str:
        """The suffix after the synthetic call turn (after `earlier_calls` synthetic calls in earlier rounds)."""
        if not tool_messages:
            raise ValueError("render_suffix needs at least one tool message")
        if earlier_calls and self.counted_by_substitution:
            counted = self._counted_suffix(tool_calls, tool_messages, earlier_calls)
            if counted is not None and next(self._substituted) % AUDIT_EVERY:
                return counted
            if counted is not None:
                return self._audited(counted, tool_calls, tool_messages, earlier_calls)
        return self._rendered_suffix(tool_calls, tool_messages, earlier_calls)

    def _rendered_suffix(self, tool_calls: Sequence[ToolCall], tool_messages: list[dict], earlier_calls: int) -> str:
        """The suffix cut from the template's render of the whole synthetic conversation."""
        try:
            for fresh in (False, True):  # the cached prefix, then (if the render no longer starts with it) a new one
                base, prefix, ids = self._call_turn(tool_calls, earlier_calls, fresh=fresh)
                results = self.sanitize(self._as_rendered(tool_messages, ids))
                second = self.render_text(base + results, self._tools, True)
                if second.startswith(prefix):
                    return second[len(prefix):]
        except TemplateError as e:
            raise SuffixRenderError(f"the chat template refused the tool turn: {e}") from e
        at = next((i for i, (a, b) in enumerate(zip(prefix, second)) if a != b), min(len(prefix), len(second)))
        raise SuffixRenderError(
            "the chat template is not prefix-stable here: adding the tool results changed how the earlier "
            f"turns render (first difference at char {at}: {prefix[at:at + 60]!r} vs {second[at:at + 60]!r}); "
            "refusing rather than returning ids the trainer would train on")

    def _as_rendered(self, tool_messages: list[dict], ids: tuple[str, ...]) -> list[dict]:
        """The tool messages as the synthetic conversation holds them: where the template does not show ids, they
        answer the synthetic turn's fixed ids."""
        if self._ids_matter:
            return tool_messages
        return [dict(m, tool_call_id=ids[i]) if i < len(ids) else m for i, m in enumerate(tool_messages)]

    def _suffix_ids(self, tool_calls: Sequence[ToolCall], group: Sequence[Message], earlier_calls: int) -> list[int]:
        return self.encode(self._suffix_after(
            tool_calls, [msgs.template_message(m, self.rules.style) for m in group], earlier_calls))

    def render_suffix(self, tool_calls: Sequence[ToolCall], tool_messages: Sequence[Message],
                      max_suffix_tokens: int | None, later_round: bool = False,
                      calls_before: int | None = None) -> SuffixResult:
        """Suffix ids for one tool group, cut to ``max_suffix_tokens`` (None: no limit; 0 is a budget).
        `later_round`: not the session's first tool round; `calls_before`: the calls the conversation has had
        before this turn (the server passes it; None: one if `later_round`)."""
        group = msgs.tool_group(tool_calls, tool_messages)
        earlier = self.earlier_calls(later_round, calls_before)
        ids = self._suffix_ids(tool_calls, group, earlier)
        if max_suffix_tokens is None or len(ids) <= max_suffix_tokens:
            return SuffixResult(ids=ids, truncated=False, overflow=False, tool_messages=group)
        return fit(self.template, group, max_suffix_tokens, lambda cut: self._suffix_ids(tool_calls, cut, earlier))

    # ------------------------------------------------------------ the model's turn, as the template writes it

    def completion_text(self, conversation: list[dict], turn: dict, tools: list[dict] | None) -> str:
        """The assistant ``turn`` as the model generates it after ``conversation``'s generation prompt:
        the template's render of the turn (from where it leaves the generation prompt) through the boundary
        (a call turn) or the token that ends an answer. Used by the golden check, tests and benches."""
        conv = self.sanitize(msgs.normalize(conversation, self.rules.style))
        before = self.render_text(conv, self.sanitize(tools), True)
        after = self.render_text(conv + self.sanitize(msgs.normalize([turn], self.rules.style)),
                                 self.sanitize(tools), False)
        text = after[self.template.turn_start(before, after):]
        find = self.template.find_token
        if turn.get("tool_calls") and not text.strip() and self.rules.rerenders_call_turn:
            # The template drops a last call turn (a prefill, Nemotron JSON): the turn as results follow it.
            results = [msgs.tool(c["function"]["name"], c.get("id", ""), _PLACEHOLDER) for c in turn["tool_calls"]]
            after = self.render_text(conv + self.sanitize(msgs.normalize([turn], self.rules.style)) + results,
                                     self.sanitize(tools), True)
            text = after[self.template.turn_start(before, after):after.find(_PLACEHOLDER)]
        if turn.get("tool_calls"):
            if self.rules.overlap:
                return text + self.rules.boundary
            return text[: find(text, self.rules.boundary, last=True) + len(self.rules.boundary)]
        end = self.rules.answer_end
        at = find(text, end)
        return text[: at + len(end)] if at >= 0 else text + end  # GLM closes an answer only when a user follows
