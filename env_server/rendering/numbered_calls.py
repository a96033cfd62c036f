"""Suffixes for templates that number the conversation's calls (llama.cpp's Kimi K2 copies), without rendering
every earlier call at each Step: the results are rendered exactly after no earlier call and, where the template
wrote each output as it is, the outputs go into the slots of a render after as many calls made once per shape with
placeholder outputs. Checked at registration (`_counts_by_substitution`) and by a whole render of the first and
every AUDIT_EVERY-th substituted suffix (`_audited`).

A part of `RenderingContext` (context.py), kept apart because it is one job: the methods here use the context's
renders (`_rendered_suffix`), its caches (`_slots`, `_lock`) and its family rules.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tito.types import ToolCall

from . import messages as msgs

log = logging.getLogger("env_server.rendering.context")

_CACHE_LIMIT = 1024
_PLACEHOLDER = "zqx_placeholder_output"  # tool output that marks where results start in a render
_MISSING = object()
AUDIT_EVERY = 64  # every so many substituted suffixes of numbered calls (the first too) is checked by a whole render


def _fill(slots: tuple[str, ...], outputs: list[str]) -> str:
    """The text around the placeholders with the outputs in their places."""
    return "".join(part for pair in zip(slots, outputs) for part in pair) + slots[-1]


class NumberedCallSuffixes:
    """The numbered-call methods of `RenderingContext`."""

    def _audited(self, counted: str, tool_calls: Sequence[ToolCall], tool_messages: list[dict],
                 earlier_calls: int) -> str:
        """The whole render, compared with the substituted suffix (the first and every AUDIT_EVERY-th one): a template
        that writes an output otherwise after more calls in a way registration's outputs did not show is then said
        loudly, and substitution is off for this tokenizer from here on."""
        whole = self._rendered_suffix(tool_calls, tool_messages, earlier_calls)
        if whole != counted:
            self.counted_by_substitution = False
            at = next((i for i, (a, b) in enumerate(zip(whole, counted)) if a != b), min(len(whole), len(counted)))
            log.error("%s template (tokenizer %s): the suffix of tool outputs after %d calls differs from the one put "
                      "together from a render after no call (at char %d: %r vs %r); numbered calls are rendered whole "
                      "from now on. Earlier suffixes of this tokenizer may differ from the template's render: its "
                      "outputs depend on the number of calls before them", self.family, self.fingerprint[:12],
                      earlier_calls, at, whole[at:at + 60], counted[at:at + 60])
        return whole

    def _counted_suffix(self, tool_calls: Sequence[ToolCall], tool_messages: list[dict],
                        earlier_calls: int) -> str | None:
        """The suffix after `earlier_calls` calls, for a template that numbers the conversation's calls, without
        rendering those calls at every Step (their render grows with the conversation).

        The tool outputs are rendered exactly, after no earlier call (the cheapest render); where the template wrote
        each output there verbatim, between text that is the same for every output (`_output_slots`), the suffix
        is that same template's text after `earlier_calls` calls, rendered once per shape with placeholder outputs,
        with the outputs in its slots. None where the outputs are not written verbatim (render the whole
        conversation instead). Registration checks this against whole renders (`_counts_by_substitution`), and the
        golden check's rounds compare it with the template's render of a real conversation."""
        contents = [self.sanitize(m.get("content")) for m in tool_messages]
        if not all(isinstance(c, str) for c in contents):
            return None
        shape = self._shape(tool_calls, tool_messages)
        first = self._output_slots(shape, tool_calls, tool_messages, 0)
        later = self._output_slots(shape, tool_calls, tool_messages, earlier_calls)
        if first is None or later is None:
            return None
        if self._rendered_suffix(tool_calls, tool_messages, 0) != _fill(first, contents):
            return None  # the template does not write these outputs as they are
        return _fill(later, contents)

    def _shape(self, tool_calls: Sequence[ToolCall], tool_messages: list[dict]) -> tuple:
        """What a suffix's text around the outputs depends on: the calls and the tool messages without their content
        (without the ids where the template does not show them: its results answer fixed ids, `_as_rendered`)."""
        shown = self._ids_matter
        answered = len(tool_calls) if self.rules.max_calls_per_turn is None else min(
            len(tool_calls), self.rules.max_calls_per_turn)
        return (tuple((c.id if shown else "", c.name) for c in tool_calls),
                tuple(tuple(sorted((k, v) for k, v in m.items()
                                   if k != "content" and (shown or k != "tool_call_id" or i >= answered)))
                      for i, m in enumerate(tool_messages)))

    def _output_slots(self, shape: tuple, tool_calls: Sequence[ToolCall], tool_messages: list[dict],
                      earlier_calls: int) -> tuple[str, ...] | None:
        """The suffix after `earlier_calls` calls with placeholder outputs, split at the placeholders (None where
        a placeholder is not written exactly once, in order); cached per `shape` and number of earlier calls."""
        key = (shape, earlier_calls)
        held = self._slots.get(key, _MISSING)  # one read: another thread may clear the cache between two
        if held is not _MISSING:
            return held  # type: ignore[return-value]
        marks = [f"{_PLACEHOLDER}_{i}" for i in range(len(tool_messages))]
        text = self._rendered_suffix(tool_calls, [dict(m, content=p) for m, p in zip(tool_messages, marks)],
                                     earlier_calls)
        parts: list[str] | None = []
        rest = text
        for p in marks:
            head, found, rest = rest.partition(p)
            if not found or p in head or p in rest:
                parts = None
                break
            parts.append(head)
        slots = None if parts is None else (*parts, rest)
        with self._lock:
            if len(self._slots) >= _CACHE_LIMIT:
                self._slots.clear()
            self._slots[key] = slots
        return slots

    def _counts_by_substitution(self) -> bool:
        """Whether `_counted_suffix` gives this template's exact suffixes: compared with whole renders for outputs
        that a template might not write as they are (blank, padded with whitespace and newlines, quoting, markup,
        the template's own call-id text), after 1 to 3 earlier calls, for one and two results."""
        if not self.counts_calls:
            return False
        style = self.rules.style
        outputs = ["", " ", "\n\n  x  \n\n", "line 1\nline 2\n", "\"quoted\" \\ 'single' <b>&amp;</b>",
                   "functions.lookup:0 ## Return of", "ünïcødé 😀", self.rules.boundary]
        verbatim = 0
        for n in (1, 2):
            calls = [ToolCall(style.call_id(0, i, "lookup", 7), "lookup", "{}") for i in range(n)]
            for earlier in (1, 3):
                for k, out in enumerate(outputs):
                    group = [msgs.tool("lookup", c.id, outputs[(k + i) % len(outputs)]) for i, c in enumerate(calls)]
                    try:
                        counted = self._counted_suffix(calls, group, earlier)
                        whole = self._rendered_suffix(calls, group, earlier)
                    except Exception:
                        return False  # the golden check reports what does not render
                    if counted is None:
                        continue  # not written verbatim: such outputs are rendered whole at every Step
                    if counted != whole:
                        log.warning("%s: numbered calls are rendered whole at every Step: the template writes the "
                                    "output %r otherwise after %d earlier calls", self.family, out, earlier)
                        return False
                    verbatim += 1
        return verbatim > 0
