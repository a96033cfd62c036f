"""Fitting a suffix into ``max_suffix_tokens``: tool outputs are cut at token level (head + marker + tail).

Short outputs stay whole (water filling); the cut text is decoded without half UTF-8 characters,
and the marker says how many tokens were removed. The result is still a valid template turn:
the suffix is re-rendered from the cut messages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from tito.types import Message

from .template import ChatTemplate
from .types import SuffixResult


def truncation_marker(removed: int) -> str:
    return f"\n…[{removed} tokens truncated]…\n"


def fit(t: ChatTemplate, messages: Sequence[Message], budget: int,
        suffix_ids: Callable[[tuple[Message, ...]], list[int]]) -> SuffixResult:
    """The suffix of ``messages`` cut to ``budget`` tokens, or an overflow if not even empty outputs fit."""
    messages = tuple(messages)
    contents = [t.encode_plain(m.content) for m in messages]
    lengths = [len(c) for c in contents]

    def build(keeps: list[int]) -> tuple[tuple[Message, ...], int]:
        out, removed_total = [], 0
        for m, ids, keep in zip(messages, contents, keeps):
            if keep < len(ids):
                removed = len(ids) - keep
                head, tail = (keep + 1) // 2, keep // 2
                m = dataclasses.replace(m, content=_decode_clean(t, ids[:head], "head") + truncation_marker(removed)
                                        + _decode_clean(t, ids[len(ids) - tail:] if tail else [], "tail"))
                removed_total += removed
            out.append(m)
        return tuple(out), removed_total

    minimal, removed_all = build([0] * len(messages))
    minimal_ids = suffix_ids(minimal)
    if len(minimal_ids) > budget:
        return SuffixResult(ids=[], truncated=False, overflow=True, tool_messages=messages)
    slack = budget - len(minimal_ids)
    for _ in range(8):
        cut, removed = build(_water_fill(lengths, slack))
        ids = suffix_ids(cut)
        if len(ids) <= budget:
            return SuffixResult(ids=ids, truncated=True, overflow=False, tool_messages=cut,
                                removed_tokens=removed)
        slack -= len(ids) - budget  # re-tokenization at the cut can cost a few tokens more
        if slack <= 0:
            break
    return SuffixResult(ids=minimal_ids, truncated=True, overflow=False, tool_messages=minimal,
                        removed_tokens=removed_all)


def _decode_clean(t: ChatTemplate, ids: list[int], side: str) -> str:
    """Decode a head/tail slice, dropping tokens that hold only part of a UTF-8 character."""
    while ids:
        text = t.decode(ids)
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
