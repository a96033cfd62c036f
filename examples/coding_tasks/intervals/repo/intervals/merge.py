"""Merging closed intervals [start, end]."""

from __future__ import annotations

from collections.abc import Iterable


def merge(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of closed intervals as sorted, disjoint intervals. Intervals that overlap or touch
    (one ends where the next starts) become one."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if start > end:
            raise ValueError(f"interval ({start}, {end}) ends before it starts")
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def total_length(intervals: Iterable[tuple[int, int]]) -> int:
    """How much of the line the intervals cover."""
    return sum(end - start for start, end in merge(intervals))
