"""ChatTemplate: one uploaded chat template, compiled once, with the tokenizer it renders for.

Control tokens inside message text (a program printing "<|im_end|>") are encoded as text,
never as the control token: that is transformers' ``apply_chat_template(...,
sanitize_control_tokens=True)``, and our ids equal that render token for token. Without it,
a tool could forge turn boundaries. Templates are compiled by jinja_engine.py (transformers' engine
configuration; see there for the one kind of template that gets its mutation-permitting variant).
"""

from __future__ import annotations

import copy
import marshal
from typing import Any

from transformers.utils.chat_template_utils import (
    _CONTROL_TOKEN_END,
    _CONTROL_TOKEN_START,
    _get_control_token_patterns,
    encode_marked_chat,
    mark_control_tokens,
)

from .jinja_engine import compile_template

_PREFILL = 64  # a generation prompt may end in up to this much text its turn does not render ('<think>\n')


def _after_tail(prompt: str, rendered: str, start: int) -> int:
    """Where ``rendered`` continues after the longest ending of ``prompt`` it holds past ``start``."""
    lo, hi, best = 8, min(len(prompt), 4096), start
    while lo <= hi:  # a longer ending is found only if a shorter one is: binary search on the length
        mid = (lo + hi) // 2
        at = rendered.find(prompt[-mid:], start)
        if at >= 0:
            best, lo = at + mid, mid + 1
        else:
            hi = mid - 1
    return best


def lcp(a: str, b: str) -> int:
    """Length of the common prefix (C-speed: whole-string and halving slice comparisons)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class ChatTemplate:
    """Render, sanitize, encode and decode for one (tokenizer, template, kwargs)."""

    def __init__(self, tokenizer: Any, chat_template: str, kwargs: dict[str, Any]) -> None:
        self.tokenizer = tokenizer
        self.source = chat_template
        self.kwargs = dict(kwargs)
        # Compiled once (compiles are shared, lru_cache). `mutates`: the list/dict methods that change
        # an object which the template calls; such a template renders on copies of its inputs.
        self._template, self.mutates = compile_template(chat_template)
        self._raw = tokenizer.backend_tokenizer  # the tokenizers.Tokenizer: no per-call wrapper overhead
        self.vocab_size = self._raw.get_vocab_size(with_added_tokens=True)
        self._vars = {**tokenizer.special_tokens_map, **self.kwargs}
        self._control_re, self._markers_re = _get_control_token_patterns(
            tokenizer._get_control_tokens(chat_template)
        )
        # Added tokens, longest first, for finding where the template writes them.
        self.added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
        # ... and those not starting with '<' (GLM's '[gMASK]'), which the scan below looks for separately.
        self._odd = [t for t in self.added if not t.startswith("<") and not t.isspace() and len(t) > 1]

    def render(self, messages: list[dict], tools: list[dict] | None = None, generation_prompt: bool = False) -> str:
        """The template's text for an already-sanitized conversation."""
        variables = dict(self._vars, messages=messages, tools=tools or None, documents=None,
                         add_generation_prompt=generation_prompt)
        if self.mutates:
            # A deep copy. The inputs are JSON-like data (sanitized messages, tool specs, JSON kwargs), which a marshal
            # round trip copies in C, 3x faster than a JSON one, keeping types and shared objects as deepcopy does.
            try:
                variables = marshal.loads(marshal.dumps(variables))
            except ValueError:  # a type marshal does not write (a str subclass, an object)
                variables = copy.deepcopy(variables)
        return self._template.render(**variables)

    def sanitize(self, obj: Any) -> Any:
        """Mark control-token strings in user-supplied text so they are encoded as text: transformers'
        ``mark_control_tokens``, walked here so that text holding no control token and no marker (almost all text)
        is returned as it is after one C-speed search, which is what marking returns for it."""
        if type(obj) is str:
            if _CONTROL_TOKEN_START in obj or _CONTROL_TOKEN_END in obj or self._control_re.search(obj):
                return mark_control_tokens(obj, self._control_re)
            return obj
        if type(obj) is dict:
            return {key: self.sanitize(value) for key, value in obj.items()}
        if type(obj) in (list, tuple):
            return [self.sanitize(value) for value in obj]
        return mark_control_tokens(obj, self._control_re)  # subclasses and everything else: transformers' walk

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

    def token_id(self, token: str) -> int | None:
        """The id of ``token`` if it is one added token of this vocabulary."""
        token_id = self._raw.token_to_id(token)
        return token_id if token_id is not None and token in self.tokenizer.get_added_vocab() else None

    def turn_start(self, prompt: str, rendered: str) -> int:
        """Where ``rendered`` leaves the generation ``prompt``: their common prefix, moved back to the start of
        an added token it would cut (DeepSeek prefills '<think>' where the turn renders '<｜tool▁calls▁begin｜>')."""
        start = lcp(prompt, rendered)
        if len(prompt) - start > _PREFILL:
            # The opening conversation renders otherwise once the turn follows (Mistral Nemo writes the system
            # message into the last user turn only): the turn starts after the prompt's own ending.
            start = _after_tail(prompt, rendered, start)
        for token, at in self.added_tokens_in(rendered, max(0, start - 64), start + 64):
            if at < start < at + len(token):
                return at
        return start

    def find_token(self, text: str, token: str, last: bool = False, start: int = 0, end: int | None = None) -> int:
        """Where the template wrote ``token`` (first or last), skipping the sanitized copies in user text; -1 if nowhere."""
        end = len(text) if end is None else end
        while True:
            at = text.rfind(token, start, end) if last else text.find(token, start, end)
            if at <= 0 or text[at - 1] != _CONTROL_TOKEN_START:
                return at
            if last:
                end = at
            else:
                start = at + 1

    def added_tokens_in(self, text: str, start: int = 0, end: int | None = None) -> list[tuple[str, int]]:
        """``(token, position)`` of each added token the text holds between ``start`` and ``end``, in order.

        Tokens inside sanitize markers are user text, not tokens, and are skipped."""
        end = len(text) if end is None else end
        out, i = [], start
        while i < end:
            at = text.find("<", i, end)
            hits = [at] if at >= 0 else []
            for tok in self._odd:
                j = text.find(tok, i, end)
                if j >= 0:
                    hits.append(j)
            if not hits:
                break
            i = min(hits)
            for tok in self.added:
                if text.startswith(tok, i) and i + len(tok) <= end:
                    if not (i > 0 and text[i - 1] == _CONTROL_TOKEN_START):
                        out.append((tok, i))
                    i += len(tok)
                    break
            else:
                i += 1
        return out
