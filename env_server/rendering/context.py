"""RenderingContext: prompt ids, completion parsing and suffix ids for one registered tokenizer.

Suffix algorithm (see docs/architecture.md and the brief's "Rendering"): render a short
synthetic conversation ending in an assistant turn that calls the same tools (real names
and ids, non-empty reasoning where the template reads it), then the same plus the whole
tool group with the generation prompt; the suffix is the difference, the first render cut
after its last end-of-turn token. The completion the model generated ends with that same
token (it is the stop token), and the suffix text starts right after it; added tokens are
split off before pre-tokenization, so tokenizing the suffix text alone gives exactly the
ids the template's own full render has there. If the first render is not a prefix of the
second, the template rewrote earlier text and we refuse loudly.

Control tokens inside tool output (a program printing "<|im_end|>") are encoded as text,
never as the control token: that is transformers' ``apply_chat_template(...,
sanitize_control_tokens=True)``, and our ids equal that render token for token. Without it,
a tool could forge turn boundaries.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jinja2.exceptions import TemplateError
from transformers.utils.chat_template_utils import (
    _CONTROL_TOKEN_END,
    _CONTROL_TOKEN_START,
    _compile_jinja_template,
    _get_control_token_patterns,
    encode_marked_chat,
    mark_control_tokens,
)

from .errors import SuffixRenderError
from .families import FamilyRules
from .parsing import PARSERS
from tito.types import Message, Role, ToolCall, call_id

from .types import ParsedCompletion, SuffixResult

_SYNTHETIC_USER = {"role": "user", "content": "."}
_SYNTHETIC_REASONING = "Calling the tools."


def truncation_marker(removed: int) -> str:
    return f"\n…[{removed} tokens truncated]…\n"


@dataclass(eq=False)
class RenderingContext:
    fingerprint: str
    family: str
    stop_token_ids: list[int]
    renderer_version: str
    chat_template: str
    chat_template_kwargs: dict[str, Any]
    rules: FamilyRules
    tokenizer: Any  # transformers PreTrainedTokenizerFast loaded from the uploaded files
    quirks: list[str] = field(default_factory=list)  # found by the golden check, for logs
    # The template refuses several calls in one assistant message: the synthetic
    # assistant turn carries only the first (tool results are rendered all the same).
    single_call_assistant: bool = False

    def __post_init__(self) -> None:
        self._template = _compile_jinja_template(self.chat_template)  # compiled once, shared (lru_cache)
        self._raw = self.tokenizer.backend_tokenizer  # the tokenizers.Tokenizer: no per-call wrapper overhead
        self._vocab_size = self._raw.get_vocab_size(with_added_tokens=True)
        self._template_vars = {**self.tokenizer.special_tokens_map, **self.chat_template_kwargs}
        self._control_re, self._markers_re = _get_control_token_patterns(
            self.tokenizer._get_control_tokens(self.chat_template)
        )
        self._stop_set = frozenset(self.stop_token_ids)
        self._stop_strings = tuple(self.tokenizer.convert_ids_to_tokens(i) for i in self.stop_token_ids)
        self._parse = PARSERS[self.rules.parser]
        self._tools_cache: dict[tuple[str, ...], list[dict]] = {}
        self._lock = threading.Lock()  # jinja templates are thread-safe; our small caches are guarded

    # ------------------------------------------------------------ low level

    def render_text(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool) -> str:
        """The template's text for an already-sanitized conversation."""
        return self._template.render(
            messages=messages,
            tools=tools or None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self._template_vars,
        )

    def sanitize(self, obj: Any) -> Any:
        """Mark control-token strings in user-supplied text so they are encoded as text."""
        return mark_control_tokens(obj, self._control_re)

    def encode(self, text: str) -> list[int]:
        """Encode rendered (sanitized) template text."""
        if _CONTROL_TOKEN_START not in text and _CONTROL_TOKEN_END not in text:
            return self._raw.encode(text, add_special_tokens=False).ids
        return encode_marked_chat(self.tokenizer, text, self._markers_re)

    def encode_plain(self, text: str) -> list[int]:
        """Tokens of ``text`` as plain text: control-token strings count as their text tokens."""
        return self.tokenizer._encode_without_added_tokens(text)

    def decode(self, ids: list[int]) -> str:
        return self._raw.decode(ids, skip_special_tokens=False)

    def render_conversation(
        self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = False
    ) -> list[int]:
        """The template's own token ids for a whole conversation (sanitized, with the kwargs)."""
        msgs = self.sanitize(_normalize_messages(messages))
        return self.encode(self.render_text(msgs, self.sanitize(tools), add_generation_prompt))

    # ------------------------------------------------------------ prompt

    def render_prompt(self, messages: list[dict], tools: list[dict]) -> list[int]:
        """The opening conversation with the tools and the generation prompt."""
        if not messages:
            raise ValueError("the opening conversation is empty: send at least one user message")
        return self.render_conversation(messages, tools, add_generation_prompt=True)

    # ------------------------------------------------------------ completion

    def parse_completion(self, completion_ids: list[int], seq: int = 0) -> ParsedCompletion:
        """Decode an assistant turn (the answer to Step `seq`) and parse its tool calls."""
        for i in completion_ids:
            if not isinstance(i, int) or not 0 <= i < self._vocab_size:
                raise ValueError(f"token id {i!r} is outside this tokenizer's vocabulary (0..{self._vocab_size - 1})")
        stopped = bool(completion_ids) and completion_ids[-1] in self._stop_set
        text = self.decode(list(completion_ids))
        body = self.decode(list(completion_ids[:-1])) if stopped else text
        # Harmony calls are delimited by their stop token (<|call|>); the others are parsed without it.
        content, reasoning, raw_calls = self._parse(text if self.rules.parser == "harmony" else body)
        calls = [ToolCall(call_id(seq, n), c.name, c.arguments, c.error) for n, c in enumerate(raw_calls)]
        limit = self.rules.max_calls_per_turn
        if limit is not None:
            calls[limit:] = [
                c if c.error else dataclasses.replace(c, error=(
                    f"this model's chat format allows {limit} tool call per turn; this call was not run. "
                    "Make one call, wait for its result, then make the next."))
                for c in calls[limit:]
            ]
        return ParsedCompletion(text=text, content=content, reasoning=reasoning, tool_calls=calls, stopped=stopped)

    # ------------------------------------------------------------ suffix

    def _synthetic_tools(self, names: tuple[str, ...]) -> list[dict]:
        tools = self._tools_cache.get(names)
        if tools is None:
            tools = [
                {
                    "type": "function",
                    "function": {
                        "name": n,
                        "description": "",
                        "parameters": {"type": "object", "properties": {}},
                    },
                }
                for n in dict.fromkeys(names)
            ]
            with self._lock:
                if len(self._tools_cache) > 256:
                    self._tools_cache.clear()
                self._tools_cache[names] = tools
        return tools

    def _synthetic_assistant(self, calls: list[ToolCall]) -> dict:
        if self.single_call_assistant:
            calls = calls[:1]
        tool_calls = []
        for i, call in enumerate(calls):
            try:
                args = json.loads(call.arguments) if call.arguments and not call.error else {}
            except ValueError:
                args = {}
            tool_calls.append(
                {
                    "id": call.id or call_id(0, i),
                    "type": "function",
                    "function": {"name": call.name or "invalid_tool_call", "arguments": args if isinstance(args, dict) else {}},
                }
            )
        message = {"role": "assistant", "content": "", "tool_calls": tool_calls}
        if self.rules.reasoning_field:
            message[self.rules.reasoning_field] = _SYNTHETIC_REASONING
        return message

    def suffix_text(self, tool_calls: Sequence[ToolCall], tool_messages: list[dict]) -> str:
        """The suffix as (sanitized) template text; raises SuffixRenderError if not prefix-stable."""
        if not tool_messages:
            raise ValueError("render_suffix needs at least one tool message")
        base = [_SYNTHETIC_USER, self._synthetic_assistant(tool_calls)]
        tools = self._synthetic_tools(tuple(c.name or "invalid_tool_call" for c in tool_calls))
        group = self.sanitize(tool_messages)
        try:
            first = self.render_text(base, tools, add_generation_prompt=False)
            second = self.render_text(base + group, tools, add_generation_prompt=True)
        except TemplateError as e:
            raise SuffixRenderError(f"the chat template refused the tool turn: {e}") from e
        cut = max((first.rfind(s) + len(s) if s in first else -1) for s in self._stop_strings)
        if cut < 0:
            raise SuffixRenderError(
                f"the template's assistant tool-call turn has no end-of-turn token ({', '.join(self._stop_strings)}); "
                "cannot tell where the model's completion ends"
            )
        if not second.startswith(first[:cut]):
            at = next(i for i, (a, b) in enumerate(zip(first[:cut], second)) if a != b) if second else 0
            raise SuffixRenderError(
                "the chat template is not prefix-stable here: adding the tool results changed how the earlier "
                f"turns render (first difference at char {at}: {first[at:at + 60]!r} vs {second[at:at + 60]!r}); "
                "refusing rather than returning ids the trainer would train on"
            )
        return second[cut:]

    def _suffix_ids(self, tool_calls: list[ToolCall], tool_messages: list[dict]) -> list[int]:
        return self.encode(self.suffix_text(tool_calls, tool_messages))

    def render_suffix(
        self,
        tool_calls: Sequence[ToolCall],
        tool_messages: Sequence[Message | dict],
        max_suffix_tokens: int | None,
    ) -> SuffixResult:
        """Suffix ids for one tool group, cut to ``max_suffix_tokens`` (None: no limit; 0 is a budget)."""
        messages = _tool_group(tool_calls, tool_messages)
        ids = self._suffix_ids(tool_calls, messages)
        if max_suffix_tokens is None or len(ids) <= max_suffix_tokens:
            return SuffixResult(ids=ids, truncated=False, overflow=False, tool_messages=_as_messages(messages))
        return self._fit(tool_calls, messages, max_suffix_tokens)

    def _fit(self, tool_calls: list[ToolCall], messages: list[dict], budget: int) -> SuffixResult:
        """Cut tool outputs at token level (head + marker + tail) until the suffix fits."""
        contents = [self.encode_plain(m["content"]) for m in messages]
        lengths = [len(c) for c in contents]

        def build(keeps: list[int]) -> tuple[list[dict], int]:
            out, removed_total = [], 0
            for m, ids, keep in zip(messages, contents, keeps):
                m = dict(m)
                if keep < len(ids):
                    removed = len(ids) - keep
                    head, tail = (keep + 1) // 2, keep // 2
                    m["content"] = (
                        self._decode_clean(ids[:head], "head")
                        + truncation_marker(removed)
                        + self._decode_clean(ids[len(ids) - tail :] if tail else [], "tail")
                    )
                    removed_total += removed
                out.append(m)
            return out, removed_total

        minimal, removed_all = build([0] * len(messages))
        minimal_ids = self._suffix_ids(tool_calls, minimal)
        if len(minimal_ids) > budget:
            return SuffixResult(ids=[], truncated=False, overflow=True, tool_messages=_as_messages(messages))
        slack = budget - len(minimal_ids)
        for _ in range(8):
            keeps = _water_fill(lengths, slack)
            cut, removed = build(keeps)
            ids = self._suffix_ids(tool_calls, cut)
            if len(ids) <= budget:
                return SuffixResult(
                    ids=ids, truncated=True, overflow=False, tool_messages=_as_messages(cut), removed_tokens=removed
                )
            slack -= len(ids) - budget  # re-tokenization at the cut can cost a few tokens more
            if slack <= 0:
                break
        return SuffixResult(
            ids=minimal_ids,
            truncated=True,
            overflow=False,
            tool_messages=_as_messages(minimal),
            removed_tokens=removed_all,
        )

    def _decode_clean(self, ids: list[int], side: str) -> str:
        """Decode a head/tail slice, dropping tokens that hold only part of a UTF-8 character."""
        while ids:
            text = self._raw.decode(ids, skip_special_tokens=False)
            bad = text.endswith("\ufffd") if side == "head" else text.startswith("\ufffd")
            if not bad:
                return text
            ids = ids[:-1] if side == "head" else ids[1:]
        return ""


def _water_fill(lengths: list[int], total: int) -> list[int]:
    """Largest per-message cap c with sum(min(len, c)) <= total; short outputs stay whole."""
    if sum(lengths) <= total:
        return list(lengths)
    lo, hi = 0, max(lengths)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(n, mid) for n in lengths) <= total:
            lo = mid
        else:
            hi = mid - 1
    return [min(n, lo) for n in lengths]


def _tool_group(tool_calls: Sequence[ToolCall], tool_messages: Sequence[Message | dict]) -> list[dict]:
    """The tool messages as the template reads them (plain dicts), names and ids filled from the calls."""
    out = []
    for i, m in enumerate(tool_messages):
        m = Message.coerce(m if isinstance(m, Message) else {"role": "tool", **m})
        call = tool_calls[i] if i < len(tool_calls) else None
        out.append(
            {
                "role": "tool",
                "content": m.content,
                "name": m.name or (call.name if call else ""),
                "tool_call_id": m.tool_call_id or (call.id if call else ""),
            }
        )
    return out


def _as_messages(group: list[dict]) -> tuple[Message, ...]:
    return tuple(Message(role=Role.TOOL, content=m["content"], name=m["name"], tool_call_id=m["tool_call_id"])
                 for m in group)


def _normalize_messages(messages: list[dict]) -> list[dict]:
    """Copy messages; tool-call arguments given as JSON text become objects (templates tojson them)."""
    out = []
    for m in messages:
        m = copy.deepcopy(dict(m))
        m = {k: v for k, v in m.items() if not (k in ("tool_calls", "reasoning_content", "name", "tool_call_id") and not v)}
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                c = dict(c)
                fn = dict(c.get("function") or {"name": c.get("name"), "arguments": c.get("arguments")})
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
                    except ValueError:
                        pass
                calls.append({"id": c.get("id"), "type": "function", "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out
