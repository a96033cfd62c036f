"""The final answer in a model's reply, read the same way by the environment's reward and the trainer's tasks."""

from __future__ import annotations

import re

# A number as people write it: sign, digits with optional thousands commas, optional decimals.
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def normalize_answer(text: str) -> str:
    """Strip whitespace, thousands commas, a leading '+' and a trailing period."""
    return text.strip().replace(",", "").rstrip(".").lstrip("+")


def extract_final_answer(reply: str) -> str:
    """The last number of the visible reply (after any `</think>`), else its last non-empty line."""
    visible = reply.split("</think>")[-1]
    numbers = _NUMBER.findall(visible)
    if numbers:
        return normalize_answer(numbers[-1])
    lines = [ln for ln in visible.splitlines() if ln.strip()]
    return normalize_answer(lines[-1]) if lines else ""


def answer_matches(reply: str, expected: str) -> bool:
    return extract_final_answer(reply) == normalize_answer(expected)
