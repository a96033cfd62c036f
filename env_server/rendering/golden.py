"""The golden check run at registration: full round trips, or the tokenizer is refused.

Synthetic multi-round tool trajectories are built both ways:
- ours, as trainer and server build them: prompt ids, then per round the model's completion
  (the template's own writing of the call turn, tokenized alone), parsed back with the family's
  parser, the tool results, and the suffix ids;
- the template's: its own full render of the conversation so far with the generation prompt.
Every round must parse back to the calls written (names and typed arguments), and ours must
equal the template's render token for token. Where the template re-renders earlier turns (it
is not prefix-stable: Qwen3 drops an empty thinking block, Nemotron drops its prefill newline),
the suffix must still be the exact tail of the template's render, and the quirk is recorded. Any other round refuses the template: a round that could not be checked
(no completion extracted, no call parsed back, no exact tail) is a refusal, never a pass.
Finally malformed and surplus calls must render a suffix, so a Step never fails for a template
reason after registration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tito.types import Message, ToolCall

from . import messages as msgs
from .context import RenderingContext
from .errors import RenderingError, UnsupportedTemplateError
from .probe import CODE, PROBE_TOOLS

GOLDEN_TOOLS = PROBE_TOOLS


@dataclass
class Round:
    calls: list[tuple[str, dict]]
    outputs: list[str]


def golden_rounds(ctx: RenderingContext) -> list[Round]:
    specials = " ".join(ctx.rules.stop_tokens + (ctx.rules.boundary, "<|im_start|>", "<tool_response>"))
    rounds = [
        Round([("run_python", {"code": "print(6 * 7)"})], ["42\n"]),
        Round([("get_weather", {"city": "Paris", "zip": "75001", "days": 3})], ["sunny, 21C"]),
        Round([("lookup", {"word": "naïve"})], [f"ünïcødé 😀 and literal {specials} in the output"]),
        Round([("run_python", {"code": CODE})], [""]),
    ]
    if ctx.rules.max_calls_per_turn is None:
        rounds.insert(1, Round([("run_python", {"code": "1"}), ("lookup", {"word": "a"})], ["1", "a: the letter"]))
    return rounds


def _refuse(label: str, k: int, what: str) -> UnsupportedTemplateError:
    return UnsupportedTemplateError(f"registration check, step 'round trip' ({label}, round {k + 1}): {what}")


def run_trajectory(ctx: RenderingContext, rounds: list[Round], label: str, reasoning: str | None,
                   system: bool = False) -> int:
    """Walk one trajectory (``system``: the conversation opens with a system message); returns the number of
    rounds that were exact token for token."""
    style = ctx.rules.style
    conv = msgs.head(style, {"role": "user", "content": "What is 6 times 7? Use the tools."})
    if system and conv[0]["role"] != "system":
        conv = [dict(msgs.SYSTEM)] + conv
    ours = ctx.render_conversation(conv, GOLDEN_TOOLS, add_generation_prompt=True)
    exact = calls_before = 0
    for k, rnd in enumerate(rounds):
        turn = msgs.assistant(style, [(style.call_id(k + 1, i, n, calls_before), n, a)
                                      for i, (n, a) in enumerate(rnd.calls)], reasoning)
        text = ctx.completion_text(conv, turn, GOLDEN_TOOLS)
        completion = ctx.encode(text)  # the template wrote it: its control tokens are real ones
        parsed = ctx.parse_completion(completion, seq=k + 1, tools=GOLDEN_TOOLS, calls_before=calls_before)
        got = [(c.name, json.loads(c.arguments) if not c.error else c.error) for c in parsed.tool_calls]
        if got != rnd.calls or not parsed.stopped:
            raise _refuse(label, k, f"the calls the template writes do not parse back with the {ctx.rules.wire} "
                          f"parser: wrote {rnd.calls}, parsed {got} from {text[-400:]!r}"
                          + ("" if parsed.stopped else " (it does not end with a stop token)"))
        results = [Message.tool_result(c, out) for c, out in zip(parsed.tool_calls, rnd.outputs)]
        suffix = ctx.render_suffix(parsed.tool_calls, results, None, later_round=k > 0, calls_before=calls_before).ids
        calls_before += len(parsed.tool_calls)
        suffix_text = ctx.decode(suffix)
        for out in rnd.outputs:
            if out.strip() and out.strip()[:20] not in suffix_text and json.dumps(out.strip())[1:21] not in suffix_text:
                raise _refuse(label, k, f"the template does not render tool results (output {out!r} is missing from "
                              f"the tool turn {suffix_text!r})")
        ours = ours + completion + suffix
        conv = conv + [turn] + [m.to_dict() for m in results]
        expected = ctx.render_conversation(conv, GOLDEN_TOOLS, add_generation_prompt=True)
        if ours == expected:
            exact += 1
        elif expected[len(expected) - len(suffix):] == suffix:
            # The template re-renders earlier text (the prompt's prefill, or the model's own turn once
            # results follow); the suffix still joins its render exactly.
            if not any(q.startswith(f"{label},") for q in ctx.quirks):
                at = next((i for i, (a, b) in enumerate(zip(ours, expected)) if a != b), 0)
                ctx.quirks.append(
                    f"{label}, round {k + 1}: the template re-renders earlier text (at token {at}: ours "
                    f"{ctx.decode(ours[at:at + 12])!r}, its render {ctx.decode(expected[at:at + 12])!r}); the "
                    "suffix is still the exact tail of its render")
            ours = expected  # go on from the template's own text
        else:
            raise _refuse(label, k, (
                "the template keeps state across rounds: it renders this round's tool turn differently from "
                "both the first round's and a later round's (tito follows one change of shape after the first "
                "round, as DeepSeek V3's template has, not more), so tool-turn ids cannot be computed per step "
                "(its render ends with "
                f"{ctx.decode(expected[len(expected) - len(suffix):])!r} where the suffix is {suffix_text!r}). "
                "Fix the template so every round's tool turn renders the same way, or use another template"))
    return exact


def _robust(ctx: RenderingContext) -> None:
    """Malformed, surplus and unknown calls must still render a suffix (their error is the tool output)."""
    style = ctx.rules.style
    bad = ToolCall(style.call_id(1, 0), "", "", "the tool call is not valid JSON")
    cases = [[bad], [ToolCall(style.call_id(1, 0, "no_such_tool-2.x"), "no_such_tool-2.x", "{}")]]
    cases.append([ToolCall(style.call_id(1, i, n), n, "{}") for i, n in enumerate(["run_python", "lookup", "x"])])
    for calls in cases:
        try:
            ctx.render_suffix(calls, [Message.tool_result(c, "Error: not run") for c in calls], None)
        except RenderingError as e:
            raise UnsupportedTemplateError(f"registration check, step 'malformed calls': {e}") from e


def _renders_system(ctx: RenderingContext) -> bool:
    try:
        return msgs.SYSTEM["content"] in ctx.render_text([dict(msgs.SYSTEM), dict(msgs.SYNTHETIC_USER)], None, True)
    except Exception:  # jinja raises anything: the template takes no system message
        return False


def golden_check(ctx: RenderingContext) -> None:
    """Refuse the tokenizer (UnsupportedTemplateError) unless every round trip is exact."""
    rounds = golden_rounds(ctx)
    with_reasoning = ctx.rules.style.reasoning_field is not None
    exact = run_trajectory(ctx, rounds, "trajectory A", msgs.SYNTHETIC_REASONING if with_reasoning else None)
    # B opens with a system message where the template renders one: some templates move it once the
    # conversation goes on (Mistral Nemo writes it into the last user turn only).
    exact += run_trajectory(ctx, rounds[::-1], "trajectory B", None, system=_renders_system(ctx))
    if exact == 0:  # every round was still verified: its completion + suffix is the template's exact tail
        ctx.quirks.append("the template re-renders earlier turns at every round; only the tails were exact")
    _robust(ctx)
