"""Readiness gate: the golden check run at registration.

Synthetic multi-turn tool trajectories are built both ways:
- ours: prompt ids + (completion ids + suffix ids) per turn, as trainer and server build them;
- the template's: its own full render of the conversation so far with the generation prompt.
They must agree token for token at every boundary where the template is prefix-stable
(its render at the previous boundary is a prefix of its render now). Where it is not (a
documented template quirk, e.g. Qwen3 drops an empty thinking block from past turns), the
suffix must still be the exact tail of the template's render, and the quirk is recorded.
Tool calls the template writes must parse back to the same names and arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from jinja2.exceptions import TemplateError

from tito.types import ToolCall, call_id

from .context import RenderingContext
from .errors import SuffixRenderError, UnsupportedTemplateError

GOLDEN_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_python",
            "description": "Run Python code in a stateful interpreter.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "the code"}},
                "required": ["code"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
        },
    },
]


@dataclass
class Round:
    calls: list[tuple[str, dict]]
    outputs: list[str]
    reasoning: str = "I should use the tool."


def golden_rounds(ctx: RenderingContext, parallel: bool = True) -> list[Round]:
    stop = ctx.tokenizer.convert_ids_to_tokens(ctx.stop_token_ids[0])
    rounds = [
        Round([("run_python", {"code": "print(6 * 7)"})], ["42\n"]),
        Round([("run_python", {"code": "print('  x  ')"})], ["  x  \n\n"]),
        Round([("lookup", {"word": "naïve"})], [f"ünïcødé 😀 and a literal {stop} in the output"]),
        Round([("run_python", {"code": "pass"})], [""]),
    ]
    if parallel:
        rounds.insert(1, Round([("run_python", {"code": "1"}), ("lookup", {"word": "a"})], ["1", "a: the letter"]))
    return rounds


def _assistant(ctx: RenderingContext, rnd: Round, index: int, reasoning: str | None) -> dict:
    msg = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": call_id(index, i), "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(rnd.calls)
        ],
    }
    if ctx.rules.reasoning_field and reasoning is not None:
        msg[ctx.rules.reasoning_field] = reasoning
    return msg


def _completion_text(ctx: RenderingContext, conv: list[dict], asst: dict) -> str | None:
    """The assistant turn as the model would generate it: the template's rendering after the
    generation prompt, up to and including the first stop token. None if the generation
    prompt is not a prefix of that rendering."""
    msgs = ctx.sanitize(conv)
    before = ctx.render_text(msgs, GOLDEN_TOOLS, add_generation_prompt=True)
    after = ctx.render_text(msgs + ctx.sanitize([asst]), GOLDEN_TOOLS, add_generation_prompt=False)
    if not after.startswith(before):
        return None
    text = after[len(before) :]
    ends = [text.find(s) + len(s) for s in ctx._stop_strings if s in text]
    return text[: min(ends)] if ends else None


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run_trajectory(ctx: RenderingContext, rounds: list[Round], label: str) -> int:
    """Walk one trajectory; returns the number of boundaries checked token for token."""
    conv = [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "What is 6 times 7? Use the tools."},
    ]
    ours = ctx.render_prompt(conv, GOLDEN_TOOLS)
    previous = ctx.render_conversation(conv, GOLDEN_TOOLS, add_generation_prompt=True)
    exact = 0
    for k, rnd in enumerate(rounds):
        asst = _assistant(ctx, rnd, k, rnd.reasoning)
        text = _completion_text(ctx, conv, asst)
        if text is None and ctx.rules.reasoning_field:
            # e.g. Qwen3 with enable_thinking=False prefills an empty thinking block: the model writes none.
            asst = _assistant(ctx, rnd, k, "")
            text = _completion_text(ctx, conv, asst)
        if text is None:
            ctx.quirks.append(
                f"{label}: the generation prompt is not a prefix of how the template renders the assistant "
                "turn; exact checks stop at this boundary"
            )
            return exact
        completion = ctx.encode(text)  # the template wrote it, so its control tokens are real ones
        parsed = ctx.parse_completion(completion, seq=k)
        want = [(n, a) for n, a in rnd.calls][: ctx.rules.max_calls_per_turn or None]
        got = [(c.name, json.loads(c.arguments) if not c.error else c.error) for c in parsed.tool_calls]
        if got[: len(want)] != want:
            raise UnsupportedTemplateError(
                f"tool calls written by the template do not parse back with the {ctx.rules.parser} parser: "
                f"wrote {want}, parsed {got} from {text!r}"
            )
        calls = [ToolCall(call_id(k, i), n, json.dumps(a)) for i, (n, a) in enumerate(rnd.calls)]
        tool_msgs = [
            {"role": "tool", "content": out, "name": c.name, "tool_call_id": c.id} for c, out in zip(calls, rnd.outputs)
        ]
        suffix = ctx.render_suffix(calls, tool_msgs, None).ids
        suffix_text = ctx.decode(suffix)
        for out in rnd.outputs:
            if out.strip() and out.strip() not in suffix_text and json.dumps(out.strip())[1:-1] not in suffix_text:
                raise UnsupportedTemplateError(
                    f"the template does not render tool results (output {out!r} is missing from the tool turn "
                    f"{suffix_text!r}); it cannot be used for tool calling"
                )
        ours = ours + completion + suffix
        conv = conv + [asst] + tool_msgs
        try:
            expected = ctx.render_conversation(conv, GOLDEN_TOOLS, add_generation_prompt=True)
        except TemplateError as e:
            ctx.quirks.append(f"{label}: the template cannot render this conversation itself ({e}); not compared")
            return exact
        if expected[len(expected) - len(suffix) :] != suffix:
            raise UnsupportedTemplateError(
                f"{label}, turn {k}: the suffix is not the tail of the template's own render "
                f"(suffix {ctx.decode(suffix)!r}, template tail {ctx.decode(expected[-len(suffix):])!r})"
            )
        if ours == expected:
            exact += 1
        elif expected[: len(previous)] != previous:
            at = _first_diff(previous, expected)
            if any(q.startswith(f"{label},") for q in ctx.quirks):
                previous = expected
                continue  # one note per trajectory is enough
            ctx.quirks.append(
                f"{label}, turn {k}: the template re-renders earlier turns (not prefix-stable at token {at}: "
                f"{ctx.decode(previous[at:at + 12])!r} became {ctx.decode(expected[at:at + 12])!r}); the suffix "
                "still matches the template's tail"
            )
        else:
            at = _first_diff(ours, expected)
            raise UnsupportedTemplateError(
                f"{label}, turn {k}: prompt + completion + suffix ids differ from the template's own render at "
                f"token {at} although the template is prefix-stable there (ours {ctx.decode(ours[at:at + 12])!r}, "
                f"template {ctx.decode(expected[at:at + 12])!r})"
            )
        previous = expected
    return exact


def golden_check(ctx: RenderingContext) -> None:
    """Refuse the tokenizer (UnsupportedTemplateError) if the suffix diff is not exact."""
    # Does the template render several calls in one assistant message?
    probe = [ToolCall(call_id(0, 0), "run_python", "{}"), ToolCall(call_id(0, 1), "lookup", "{}")]
    probe_msgs = [{"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}]
    try:
        ctx.suffix_text(probe, probe_msgs)
    except SuffixRenderError as e:
        if "refused" not in str(e):
            raise UnsupportedTemplateError(f"parallel tool results: {e}") from e
        ctx.single_call_assistant = True
        ctx.suffix_text(probe, probe_msgs)  # must work with the first call only, else refuse
        ctx.quirks.append(
            "the template refuses several calls in one assistant message; the synthetic turn carries the first "
            "call and all results are rendered as one group"
        )
    exact = run_trajectory(ctx, golden_rounds(ctx, parallel=not ctx.single_call_assistant), "trajectory A")
    exact += run_trajectory(ctx, golden_rounds(ctx, parallel=False)[::-1], "trajectory B")
    if exact == 0:
        # Nothing to disagree with: every suffix was still checked as the exact tail of the template's render.
        ctx.quirks.append(
            "the template re-renders earlier turns at every boundary, so only the suffix tails were checked"
        )
