"""Property tests of the rollout state and loop: random generations, suffixes, budgets, failures.

Fakes here are in-process stand-ins for the *policy* and (for these property tests only) the
*environment*, implementing the same Python interfaces as the real backend and gRPC client.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.inprocess_env import InProcessEnv
from tito.client import TitoError
from tito.rollout.generation import FinishReason, GenRequest, GenResult
from tito.rollout.state import AbortCause, Rollout, RolloutStateError, Status, TruncationCause
from tito.types import OpenedSession, StepResult, StepStatus, ToolCall, call_id
from trainer.rollout import BatchStats, GenerationScheduler, RolloutLimits, RolloutRunner, RolloutSpec

STOP = 7


@dataclass
class TurnPlan:
    gen_len: int
    stop: bool
    logprobs_ok: bool
    suffix_len: int
    done: bool  # with status OK: the episode ends (EPISODE_END)
    status: StepStatus  # OK | SUFFIX_OVERFLOW | SANDBOX_LOST | ERROR
    step_fails: bool


@dataclass
class AttemptPlan:
    prompt_len: int
    open_fails: bool
    turns: list[TurnPlan]


turn_plans = st.builds(
    TurnPlan,
    gen_len=st.integers(1, 40),
    stop=st.booleans(),
    logprobs_ok=st.sampled_from([True] * 5 + [False]),
    suffix_len=st.integers(0, 60),
    done=st.booleans(),
    status=st.sampled_from([StepStatus.OK] * 3 + [StepStatus.SUFFIX_OVERFLOW, StepStatus.SANDBOX_LOST,
                            StepStatus.ERROR]),
    step_fails=st.sampled_from([False] * 6 + [True]),
)
attempt_plans = st.builds(
    AttemptPlan,
    prompt_len=st.integers(1, 120),
    open_fails=st.sampled_from([False] * 6 + [True]),
    turns=st.lists(turn_plans, min_size=6, max_size=6),
)


@dataclass
class World:
    """Shared record of what the fake policy and env did, to check the rollouts against."""

    plans: dict[int, list[AttemptPlan]]  # by spec index, one plan per attempt
    attempts: dict[int, int] = field(default_factory=dict)
    session_key: dict[str, tuple[int, int]] = field(default_factory=dict)  # session -> (spec, attempt)
    prompts: dict[str, list[int]] = field(default_factory=dict)
    generated: dict[tuple[int, int], list[list[int]]] = field(default_factory=dict)
    suffixes: dict[str, list[list[int]]] = field(default_factory=dict)
    seqs: dict[str, list[int]] = field(default_factory=dict)
    open_sessions: set[str] = field(default_factory=set)
    step_after_length_cut: bool = False


class FakeEnv(InProcessEnv):
    """Plays each attempt's plan (faults included)."""

    def __init__(self, world: World) -> None:
        self.w = world

    async def open(self, request):
        await asyncio.sleep(0)
        key = json.loads(request.env_args_json)["spec"]
        attempt = self.w.attempts.get(key, 0)
        self.w.attempts[key] = attempt + 1
        plan = self.w.plans[key][attempt]
        if plan.open_fails:
            raise TitoError("OpenSession", grpc.StatusCode.UNAVAILABLE, "fake outage")
        sid = f"session-{key}-{attempt}"
        prompt = [100000 + attempt * 1000 + i for i in range(plan.prompt_len)]
        self.w.session_key[sid] = (key, attempt)
        self.w.prompts[sid] = prompt
        self.w.suffixes[sid] = []
        self.w.seqs[sid] = []
        self.w.open_sessions.add(sid)
        return OpenedSession(sid, tuple(prompt), tools=())

    async def step(self, request):
        await asyncio.sleep(0)
        session_id, seq, completion_ids = request.session_id, request.seq, request.completion_ids
        # always a budget, never "no limit"
        assert request.max_suffix_tokens is not None and request.max_suffix_tokens >= 0
        key, attempt = self.w.session_key[session_id]
        if completion_ids[-1] != STOP:
            self.w.step_after_length_cut = True
        self.w.seqs[session_id].append(seq)
        tp = self.w.plans[key][attempt].turns[seq - 1]
        if tp.step_fails:
            raise TitoError("Step", grpc.StatusCode.NOT_FOUND, "unknown session (server restarted)")
        status = StepStatus.EPISODE_END if tp.done and tp.status is StepStatus.OK else tp.status
        # Suffix ids come only with OK, and (like a server that reads 0 as "no limit") maybe more
        # than the budget: the trainer must enforce it.
        suffix = [200000 + seq * 100 + i for i in range(tp.suffix_len)] if status is StepStatus.OK else []
        self.w.suffixes[session_id].append(suffix)
        calls = () if status.done else (ToolCall(call_id(seq, 0), "run_python", "{}"),)
        return StepResult(seq=seq, status=status, suffix_ids=tuple(suffix), tool_calls=calls,
                          reward=1.0 if status.done else None)

    async def close_session(self, session_id):
        self.w.open_sessions.discard(session_id)
        return True


class FakePolicy:
    def __init__(self, world: World) -> None:
        self.w = world

    def sync_weights(self, model):
        pass

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        await asyncio.sleep(0)
        out = []
        for r in requests:
            key, attempt = r.key.spec, r.key.attempt
            plan = self.w.plans[key][attempt].turns[r.turn]
            n = min(plan.gen_len, r.max_new)
            stops = plan.stop and plan.gen_len <= r.max_new
            ids = [1000 + r.turn * 100 + j for j in range(n - 1)] + [STOP if stops else 999]
            lps = [-0.5 - j / 100 for j in range(n)] if plan.logprobs_ok else [-0.5] * (n - 1)
            self.w.generated.setdefault((key, attempt), []).append(ids)
            out.append(GenResult(ids=ids, logprobs=lps,
                                 finish_reason=FinishReason.STOP if stops else FinishReason.LENGTH))
        return out


def check_rollout(r: Rollout, w: World, lim: RolloutLimits) -> None:
    r.check()
    assert len(r.ids) == len(r.mask) == len(r.logprobs) <= lim.budget
    assert all(math.isfinite(lp) for lp, m in zip(r.logprobs, r.mask) if m == 1)
    assert all(math.isnan(lp) for lp, m in zip(r.logprobs, r.mask) if m == 0)
    sid = r.session_id
    key, attempt = w.session_key[sid]
    assert attempt == r.attempt  # a retry is a fresh Rollout with its own session
    gens = w.generated.get((key, attempt), [])
    expected, mask = list(w.prompts[sid]), [0] * len(w.prompts[sid])
    assert len(r.turns) == len(gens)
    for t, rec in enumerate(r.turns):
        expected += gens[t]
        mask += [1] * len(gens[t])
        if rec.suffix_len:
            assert rec.suffix_len == len(w.suffixes[sid][t])  # verbatim or not at all
            expected += w.suffixes[sid][t]
            mask += [0] * rec.suffix_len
    assert r.ids == expected
    assert r.mask == mask
    # Steps: seq 1, 2, 3... one per turn that ended on a stop token, none after a length cut.
    assert w.seqs[sid] == list(range(1, len(w.seqs[sid]) + 1))
    stopped_turns = [t for t in r.turns if t.finish_reason is FinishReason.STOP]
    assert len(w.seqs[sid]) == len(stopped_turns)
    last = r.turns[-1] if r.turns else None
    if r.status is Status.TRUNCATED:
        if r.truncation is TruncationCause.LENGTH:
            # cut mid-generation, or no room left to start a turn
            assert (last is not None and last.finish_reason is FinishReason.LENGTH) or r.remaining < 1
        elif r.truncation is TruncationCause.MAX_TURNS:
            assert len(r.turns) == lim.max_turns
        elif r.truncation is TruncationCause.TOOL_OVERFLOW:
            assert last.suffix_len == 0
    if r.status is Status.COMPLETED:
        assert last.finish_reason is FinishReason.STOP and r.env_reward == 1.0
        assert last.step_status is StepStatus.EPISODE_END
    if last is not None and last.finish_reason is FinishReason.LENGTH:
        assert r.status is Status.TRUNCATED and r.truncation is TruncationCause.LENGTH


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    budget=st.integers(2, 250),
    cap=st.integers(1, 50),
    reserve=st.integers(0, 12),
    max_turns=st.integers(1, 5),
    retries=st.integers(0, 2),
    plans=st.lists(st.lists(attempt_plans, min_size=3, max_size=3), min_size=1, max_size=4),
)
def test_rollout_loop_keeps_sequences_aligned(budget, cap, reserve, max_turns, retries, plans):
    lim = RolloutLimits(budget=budget, per_turn_cap=cap, reserve=reserve, max_turns=max_turns,
                        retries=retries)
    world = World(plans=dict(enumerate(plans)))

    async def go():
        sched = GenerationScheduler(FakePolicy(world), max_wait_s=0.001)
        runner = RolloutRunner(lim, sched, FakeEnv(world), "python", "", [STOP])
        specs = [RolloutSpec(group=0, messages=[{"role": "user", "content": f"spec {i}"}],
                             env_args={"spec": i}) for i in world.plans]
        try:
            return await runner.run_batch(specs)
        finally:
            await sched.close()

    rollouts, stats = asyncio.run(go())
    assert isinstance(stats, BatchStats)
    assert len(rollouts) + stats.dropped == len(plans)
    assert stats.attempts == len(rollouts) + stats.aborted_attempts
    assert stats.aborted_attempts <= len(plans) * (retries + 1)
    for r in rollouts:
        assert r.status in (Status.COMPLETED, Status.TRUNCATED)
        check_rollout(r, world, lim)
        event(f"{r.status.value}:{r.truncation.value if r.truncation else ''}")
    event(f"dropped>0: {stats.dropped > 0}")
    assert not world.open_sessions, "every session is closed, aborted ones too"
    assert not world.step_after_length_cut


@settings(max_examples=200, deadline=None)
@given(
    budget=st.integers(1, 100),
    ops=st.lists(st.tuples(st.sampled_from(["gen", "env", "bad_gen", "done"]),
                           st.integers(0, 40), st.booleans()), max_size=12),
    prompt_len=st.integers(1, 60),
)
def test_state_methods_never_misalign(budget, ops, prompt_len):
    """Direct mutations: every accepted change keeps lengths equal; refused ones change nothing."""
    r = Rollout(budget=budget)
    try:
        r.start(list(range(prompt_len)))
    except RolloutStateError:
        assert prompt_len > budget and r.ids == []
        return
    for op, n, flag in ops:
        before = (list(r.ids), list(r.mask), list(r.logprobs), r.status)
        try:
            if op == "gen":
                r.append_generated(list(range(n)), [-1.0] * n,
                                   FinishReason.STOP if flag else FinishReason.LENGTH, max(n, 1))
            elif op == "bad_gen":
                lps = [float("nan")] * n if flag else [-1.0] * (n + 1)
                r.append_generated(list(range(n)), lps, FinishReason.STOP, n + 1)
            elif op == "env":
                r.append_env(list(range(n)))
            else:
                r.complete() if flag else r.truncate(TruncationCause.TOOL_OVERFLOW)
        except RolloutStateError:
            assert (r.ids, r.mask, r.logprobs, r.status) == before
        r.check()
        assert len(r.ids) <= budget


def test_retry_starts_clean():
    r = Rollout(budget=10)
    r.start([1, 2])
    with pytest.raises(RolloutStateError):
        r.start([3])
    r.append_generated([5], [-1.0], FinishReason.STOP, 4)
    r.abort(AbortCause.SANDBOX_LOST, "OOM")
    with pytest.raises(RolloutStateError):
        r.append_env([1])
    assert not r.abort(AbortCause.CANCELLED, "again")  # stays with the first reason
    assert r.abort_cause is AbortCause.SANDBOX_LOST and r.abort_reason == "sandbox_lost: OOM"
