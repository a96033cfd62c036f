"""The one turn rule (`tito.rollout.turns`), driven directly through every outcome, and a check that
both rollout loops (the trainer's and TRL's) leave every decision to it."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from tito.rollout import turns
from tito.rollout.generation import FinishReason, GenResult
from tito.rollout.state import AbortCause, Rollout, Status, TruncationCause
from tito.types import StepResult, StepStatus, StepTiming, ToolCall

REPO = Path(__file__).resolve().parents[2]
LIMITS = turns.TurnLimits(per_turn_cap=8, reserve=4, max_turns=3)
PROMPT = [11, 12, 13]
STOP = 2


def started(budget: int = 64) -> Rollout:
    r = Rollout(budget=budget)
    assert turns.start(r, PROMPT)
    return r


def generated(r: Rollout, n: int = 3, finish: FinishReason = FinishReason.STOP) -> bool:
    ids = [5] * (n - 1) + [STOP if finish is FinishReason.STOP else 6]
    return turns.after_generation(r, GenResult(ids=ids, logprobs=[-0.5] * n, finish_reason=finish),
                                  turns.next_turn(r, LIMITS))


def answer(status: StepStatus, suffix: int = 0, **kw) -> StepResult:
    return StepResult(seq=1, status=status, suffix_ids=tuple(range(100, 100 + suffix)),
                      tool_calls=(ToolCall("c1", "run_python", "{}"),), timing=StepTiming(tools_ms=1.5), **kw)


# ------------------------------------------------------------------------------------ go on

def test_a_generated_turn_goes_to_the_env_and_an_ok_step_appends_the_suffix_verbatim():
    r = started()
    assert turns.next_turn(r, LIMITS) == 8
    assert generated(r)
    assert turns.suffix_budget(r, LIMITS) == 64 - 6 - 4
    assert turns.after_step(r, answer(StepStatus.OK, suffix=5, truncated=True), LIMITS)
    assert r.ids == PROMPT + [5, 5, STOP] + list(range(100, 105))
    assert r.mask == [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0]
    assert all(math.isnan(x) for x in r.logprobs[:3] + r.logprobs[6:]) and r.logprobs[3:6] == [-0.5] * 3
    t = r.turns[0]
    assert (t.step_status, t.tool_calls, t.tool_truncated, t.tools_ms, t.suffix_len) == (StepStatus.OK, 1, True, 1.5, 5)
    assert r.status is Status.RUNNING


def test_max_new_is_the_cap_or_what_the_budget_has_left():
    r = started(budget=9)
    assert turns.next_turn(r, LIMITS) == 6  # 9 - 3 prompt ids < the cap of 8


def test_the_suffix_budget_is_never_negative_and_never_no_limit():
    r = started(budget=8)
    generated(r, n=3)
    assert turns.suffix_budget(r, LIMITS) == 0  # 2 left, reserve 4: a real budget of zero


# ------------------------------------------------------------------------------------ complete

def test_episode_end_completes_with_the_env_reward():
    r = started()
    generated(r)
    assert not turns.after_step(r, answer(StepStatus.EPISODE_END, reward=1.0), LIMITS)
    assert r.status is Status.COMPLETED and r.env_reward == 1.0


def test_without_an_environment_a_stopped_turn_completes():
    r = started()
    res = GenResult(ids=[4, STOP], logprobs=[-1.0, -1.0], finish_reason=FinishReason.STOP)
    assert not turns.after_generation(r, res, 8, stepping=False)
    assert r.status is Status.COMPLETED and r.env_reward is None


# ------------------------------------------------------------------------------------ truncate

def test_truncated_length_when_cut_mid_turn():
    r = started()
    assert not generated(r, n=8, finish=FinishReason.LENGTH)
    assert (r.status, r.truncation) == (Status.TRUNCATED, TruncationCause.LENGTH)
    assert len(r.turns) == 1  # the cut turn is kept (trained on), but nothing runs


def test_truncated_length_when_no_token_fits():
    r = Rollout(budget=3)
    assert turns.start(r, PROMPT)
    assert turns.next_turn(r, LIMITS) is None
    assert (r.status, r.truncation) == (Status.TRUNCATED, TruncationCause.LENGTH)
    assert turns.next_turn(r, LIMITS) is None  # and stays ended


def test_truncated_tool_overflow_when_the_server_says_so():
    r = started()
    generated(r)
    assert not turns.after_step(r, answer(StepStatus.SUFFIX_OVERFLOW), LIMITS)
    assert (r.status, r.truncation) == (Status.TRUNCATED, TruncationCause.TOOL_OVERFLOW)


def test_truncated_tool_overflow_when_the_suffix_passes_the_budget_anyway():
    r = started(budget=20)
    generated(r)  # 14 left, reserve 4: a budget of 10
    assert not turns.after_step(r, answer(StepStatus.OK, suffix=11), LIMITS)
    assert (r.status, r.truncation) == (Status.TRUNCATED, TruncationCause.TOOL_OVERFLOW)
    assert r.turns[0].suffix_len == 0 and len(r.ids) == 6  # nothing appended


def test_truncated_max_turns_after_the_last_allowed_turn():
    r = started()
    for _ in range(LIMITS.max_turns - 1):
        generated(r)
        assert turns.after_step(r, answer(StepStatus.OK, suffix=2), LIMITS)
    generated(r)
    assert not turns.after_step(r, answer(StepStatus.OK, suffix=2), LIMITS)
    assert (r.status, r.truncation) == (Status.TRUNCATED, TruncationCause.MAX_TURNS)
    assert r.turns[-1].suffix_len == 0  # the episode goes on; the rollout stops before its suffix


# ------------------------------------------------------------------------------------ abort

ABORTS = {
    AbortCause.BAD_PROMPT: lambda r: turns.start(r, []),
    AbortCause.ENV_CALL_FAILED: lambda r: turns.start(r, ConnectionError("server gone")),
    AbortCause.GENERATION_FAILED: lambda r: turns.after_generation(r, GenResult.failed("engine died"), 8),
    AbortCause.NO_TOKENS: lambda r: turns.after_generation(r, GenResult([], [], FinishReason.STOP), 8),
    AbortCause.MISSING_LOGPROBS: lambda r: turns.after_generation(r, GenResult([4, STOP], None, FinishReason.STOP), 8),
    AbortCause.NONFINITE_LOGPROBS: lambda r: turns.after_generation(
        r, GenResult([4, STOP], [-1.0, float("nan")], FinishReason.STOP), 8),
    AbortCause.INVALID_TURN: lambda r: turns.after_generation(r, GenResult([4] * 5, [-1.0] * 5, FinishReason.STOP), 4),
    AbortCause.SANDBOX_LOST: lambda r: generated(r) and turns.after_step(
        r, answer(StepStatus.SANDBOX_LOST, detail="out of memory"), LIMITS),
    AbortCause.STEP_FAILED: lambda r: generated(r) and turns.after_step(r, answer(StepStatus.ERROR, detail="boom"), LIMITS),
}
LOOP_ABORTS = {AbortCause.CANCELLED, AbortCause.INTERNAL_ERROR}  # the loops' own, around the rule


@pytest.mark.parametrize("cause", list(ABORTS), ids=lambda c: c.value)
def test_each_abort_cause(cause):
    r = Rollout(budget=64)
    if cause not in (AbortCause.BAD_PROMPT, AbortCause.ENV_CALL_FAILED):
        turns.start(r, PROMPT)
    assert not ABORTS[cause](r)
    assert r.status is Status.ABORTED and r.abort_cause is cause
    assert r.abort_reason.startswith(cause.value)
    r.check()


def test_every_abort_cause_is_driven_by_the_rule_or_is_a_loop_s_own():
    assert set(ABORTS) | LOOP_ABORTS == set(AbortCause)


def test_a_step_that_raised_aborts_with_the_error():
    r = started()
    generated(r)
    assert not turns.after_step(r, TimeoutError("deadline"), LIMITS)
    assert r.abort_cause is AbortCause.ENV_CALL_FAILED and "TimeoutError: deadline" in r.abort_reason


def test_an_unknown_status_aborts():
    r = started()
    generated(r)
    assert not turns.after_step(r, answer(StepStatus.UNSPECIFIED), LIMITS)
    assert r.abort_cause is AbortCause.STEP_FAILED


# ------------------------------------------------------------------------------------ the callers

CALLERS = ["trainer/rollout.py", "tito/trl/rollout.py"]
RULE = {"start", "next_turn", "after_generation", "suffix_budget", "after_step"}
# What only the rule may do: look at a status, a finish reason or a truncation cause, or change a rollout.
DECISIONS = {"StepStatus", "FinishReason", "TruncationCause", "truncate", "complete", "append_generated",
             "append_env"}


@pytest.mark.parametrize("path", CALLERS)
def test_the_rollout_loops_call_the_rule_and_decide_nothing_themselves(path):
    tree = ast.parse((REPO / path).read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    used = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "turns"}
    assert RULE <= used, f"{path} must call every step of tito.rollout.turns (missing {RULE - used})"
    assert not (names | attrs) & DECISIONS, f"{path} decides turn outcomes itself: {(names | attrs) & DECISIONS}"
    aborts = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and n.func.attr == "abort"]
    for call in aborts:
        cause = call.args[0]
        assert isinstance(cause, ast.Attribute) and cause.attr in {c.name for c in LOOP_ABORTS}, \
            f"{path}:{call.lineno} aborts a rollout itself"
