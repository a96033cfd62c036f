"""The one turn rule: what a rollout does after a generation and after a Step.

Both rollout loops call these functions and decide nothing themselves: the trainer's
(`trainer/rollout.py`, one asyncio task per rollout) and TRL's (`tito/trl/rollout.py`, one batch
per turn). A loop is

    if not turns.start(rollout, prompt_ids):       # the session's prompt ids
        return
    while (max_new := turns.next_turn(rollout, limits)) is not None:
        result = <generate up to max_new tokens, stopping on the stop ids>
        if not turns.after_generation(rollout, result, max_new):
            break
        answer = <Step the session with result.ids, max_suffix_tokens=turns.suffix_budget(rollout, limits)>
        if not turns.after_step(rollout, answer, limits):
            break

Every outcome is one of: go on, complete (the episode ended on its own terms), truncate (a
`TruncationCause`) or abort (an `AbortCause`: never trained on). The rollout's state carries it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tito.rollout.generation import FinishReason, GenResult
from tito.rollout.state import AbortCause, Rollout, RolloutStateError, TruncationCause
from tito.types import StepResult, StepStatus


@dataclass(frozen=True)
class TurnLimits:
    """The limits of one rollout's turns (the context budget is the rollout's own `budget`)."""

    per_turn_cap: int  # max new tokens of one assistant turn
    reserve: int  # tokens a tool suffix leaves free, so the next turn can generate
    max_turns: int  # assistant turns; an episode still going after the last is truncated:max_turns

    def __post_init__(self) -> None:
        if self.per_turn_cap < 1 or self.reserve < 0 or self.max_turns < 1:
            raise ValueError(f"need per_turn_cap >= 1, reserve >= 0 and max_turns >= 1; got {self}")


def start(r: Rollout, prompt_ids: Sequence[int] | BaseException) -> bool:
    """Set the prompt (the ids the server rendered for the session), or take the exception opening the
    session raised. False, and the rollout aborted, when it failed, or the prompt is empty or does not
    fit the budget."""
    if isinstance(prompt_ids, BaseException):
        r.abort(AbortCause.ENV_CALL_FAILED, f"{type(prompt_ids).__name__}: {prompt_ids}")
        return False
    if not prompt_ids:
        r.abort(AbortCause.BAD_PROMPT, "no prompt ids (a session opened without a tokenizer fingerprint, or a task "
                                       "that supplies none)")
        return False
    if len(prompt_ids) > r.budget:
        r.abort(AbortCause.BAD_PROMPT, f"the prompt of {len(prompt_ids)} tokens does not fit the budget of {r.budget}")
        return False
    r.start(prompt_ids)
    return True


def next_turn(r: Rollout, limits: TurnLimits) -> int | None:
    """The `max_new` of the next generation: min(per-turn cap, what the budget has left). None when
    no token fits (the rollout is then truncated:length) or the rollout has already ended."""
    if r.finished:
        return None
    max_new = min(limits.per_turn_cap, r.remaining)
    if max_new < 1:
        r.truncate(TruncationCause.LENGTH)
        return None
    return max_new


def after_generation(r: Rollout, result: GenResult, max_new: int, *, stepping: bool = True) -> bool:
    """Append a generated turn (mask 1). True when it ended on a stop id and goes to the environment.

    Ends the rollout otherwise: aborted when the backend failed or the turn is unusable (no ids,
    not one finite logprob per id, more ids than asked); truncated:length when cut by length (a
    half-written tool call must not run); completed when there is no environment (`stepping=False`).
    """
    if result.error:
        r.abort(AbortCause.GENERATION_FAILED, result.error)
        return False
    if not result.ids:
        r.abort(AbortCause.NO_TOKENS, "the backend generated no tokens")
        return False
    if result.logprobs is None or len(result.logprobs) != len(result.ids):
        got = "no" if result.logprobs is None else len(result.logprobs)
        r.abort(AbortCause.MISSING_LOGPROBS, f"the backend returned {got} logprobs for {len(result.ids)} tokens")
        return False
    if not all(math.isfinite(x) for x in result.logprobs):
        r.abort(AbortCause.NONFINITE_LOGPROBS, "the backend returned non-finite logprobs")
        return False
    try:
        r.append_generated(result.ids, result.logprobs, result.finish_reason, max_new)
    except RolloutStateError as e:
        r.abort(AbortCause.INVALID_TURN, str(e))
        return False
    if result.finish_reason is FinishReason.LENGTH:
        r.truncate(TruncationCause.LENGTH)
        return False
    if not stepping:
        r.complete()
        return False
    return True


def suffix_budget(r: Rollout, limits: TurnLimits) -> int:
    """`max_suffix_tokens` for the Step after the last turn: the budget left minus the reserve.
    Never None ("no limit"): no room is a real budget of zero, which the server answers with
    SUFFIX_OVERFLOW."""
    return max(0, r.remaining - limits.reserve)


def after_step(r: Rollout, answer: StepResult | BaseException, limits: TurnLimits) -> bool:
    """Apply a Step's answer (or the exception the call raised). True when the rollout goes on.

    The status is the one authority: OK appends the suffix ids verbatim (mask 0) unless they would
    pass the suffix budget (truncated:tool_overflow, also for a server that ignored the budget) or
    this was the last allowed turn (truncated:max_turns, the suffix not appended); EPISODE_END
    completes with the environment's reward (and its detail, for the record); SUFFIX_OVERFLOW truncates;
    SANDBOX_LOST and ERROR abort.
    """
    if isinstance(answer, BaseException):
        r.abort(AbortCause.ENV_CALL_FAILED, f"{type(answer).__name__}: {answer}")
        return False
    turn = r.turns[-1]
    turn.step_status = answer.status
    turn.tool_calls = len(answer.tool_calls)
    turn.tool_truncated = answer.truncated
    turn.tools_ms = answer.timing.tools_ms
    match answer.status:
        case StepStatus.OK if len(answer.suffix_ids) > suffix_budget(r, limits):
            r.truncate(TruncationCause.TOOL_OVERFLOW)
        case StepStatus.OK if len(r.turns) >= limits.max_turns:
            r.truncate(TruncationCause.MAX_TURNS)  # the episode goes on, the rollout stops here
        case StepStatus.OK:
            r.append_env(answer.suffix_ids)
            return True
        case StepStatus.EPISODE_END:
            r.complete(answer.reward, answer.detail)
        case StepStatus.SUFFIX_OVERFLOW:
            r.truncate(TruncationCause.TOOL_OVERFLOW)
        case StepStatus.SANDBOX_LOST:
            r.abort(AbortCause.SANDBOX_LOST, answer.detail or "no detail")
        case _:  # ERROR (or a status this client does not know): the session is over mid-episode
            r.abort(AbortCause.STEP_FAILED, f"{answer.status.name}: {answer.detail or 'no detail'}")
    return False
