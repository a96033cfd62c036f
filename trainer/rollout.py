"""The rollout loop: generate, Step the environment, append its suffix ids verbatim, repeat.

Many rollouts run as asyncio tasks. Generation requests from all rollouts waiting at a turn are
batched by `GenerationScheduler` (the backend runs off the event loop), so one rollout's tool
execution overlaps others' generation. A failed env call aborts only its own rollout.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from tito.types import Message, StepStatus
from trainer.backends.base import FinishReason, GenerationBackend, GenRequest, GenResult, RolloutKey
from trainer.config import TrainConfig
from trainer.env_client import EnvClient
from trainer.state import Rollout, Status, TruncationCause

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutLimits:
    budget: int  # context budget: len(ids) never exceeds it
    per_turn_cap: int  # max new tokens per assistant turn
    reserve: int  # tokens kept free after a suffix, so the next turn can generate
    max_turns: int
    temperature: float = 1.0
    retries: int = 1  # extra attempts for an aborted rollout before it is dropped

    def __post_init__(self) -> None:
        if self.budget < 2 or self.per_turn_cap < 1 or self.reserve < 0 or self.max_turns < 1:
            raise ValueError(f"invalid rollout limits: {self}")

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> RolloutLimits:
        b = cfg.budget
        return cls(budget=b.context, per_turn_cap=b.per_turn, reserve=b.reserve, max_turns=b.max_turns,
                   temperature=cfg.temperature, retries=cfg.retries)


@dataclass
class RolloutSpec:
    """What one rollout starts from. For env tasks the server renders `messages` to prompt_ids;
    tasks without an environment supply `prompt_ids` directly (never rendered by the trainer).
    Messages may be given as OpenAI-style dicts; they are kept as `Message`s."""

    group: int
    messages: list[Message] = field(default_factory=list)
    env_args: dict[str, Any] | None = None
    prompt_ids: list[int] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.messages = [Message.coerce(m) for m in self.messages]


@dataclass
class BatchStats:
    attempts: int = 0
    aborted_attempts: int = 0
    dropped: int = 0
    abort_reasons: list[str] = field(default_factory=list)


class GenerationScheduler:
    """Collects generation requests from concurrent rollouts and runs them as batches.

    A batch starts as soon as every active rollout is waiting for generation, or after
    `max_wait_s` if some are still busy in env calls (so one slow tool never stalls the rest).
    """

    def __init__(self, backend: GenerationBackend, max_wait_s: float = 0.02) -> None:
        self.backend = backend
        self.max_wait_s = max_wait_s
        self.active = 0
        self._pending: list[tuple[GenRequest, asyncio.Future]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def register(self) -> None:
        self.active += 1

    def unregister(self) -> None:
        self.active -= 1
        self._wake.set()

    async def submit(self, req: GenRequest) -> GenResult:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="generation-scheduler")
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((req, fut))
        self._wake.set()
        return await fut

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wake.clear()
                await self._wake.wait()
            deadline = loop.time() + self.max_wait_s
            while len(self._pending) < self.active and loop.time() < deadline:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), deadline - loop.time())
                except TimeoutError:
                    break
            batch, self._pending = self._pending, []
            try:
                results = await self.backend.generate([r for r, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"backend returned {len(results)} results for {len(batch)}")
            except Exception as e:  # the rollouts abort; the scheduler keeps serving
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            for (_, fut), res in zip(batch, results):
                if not fut.done():
                    fut.set_result(res)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None


class RolloutRunner:
    def __init__(self, limits: RolloutLimits, scheduler: GenerationScheduler,
                 env: EnvClient | None, environment: str, stop_token_ids: list[int],
                 close_timeout_s: float = 30.0) -> None:
        self.limits = limits
        self.scheduler = scheduler
        self.env = env
        self.environment = environment
        self.stop_token_ids = tuple(stop_token_ids)
        self.close_timeout_s = close_timeout_s

    async def run_one(self, spec: RolloutSpec, key: RolloutKey) -> Rollout:
        """One attempt, from a clean state. Never raises for env or backend failures."""
        r = Rollout(budget=self.limits.budget, group=spec.group, attempt=key.attempt, meta=dict(spec.meta))
        self.scheduler.register()
        try:
            await self._episode(r, spec, key)
        except asyncio.CancelledError:
            r.abort("cancelled")
            raise
        except Exception as e:
            # Env errors, backend errors, invariant violations: this rollout only.
            log.warning("rollout %s aborted: %s: %s", key, type(e).__name__, e)
            r.abort(f"{type(e).__name__}: {e}")
        finally:
            self.scheduler.unregister()
            if r.session_id is not None and self.env is not None:
                try:
                    await asyncio.wait_for(self.env.close_session(r.session_id), self.close_timeout_s)
                except Exception as e:  # the server's idle TTL reclaims it anyway
                    log.warning("CloseSession(%s) failed: %s", r.session_id, e)
        return r

    async def _episode(self, r: Rollout, spec: RolloutSpec, key: RolloutKey) -> None:
        lim = self.limits
        if self.env is None:
            if not spec.prompt_ids:
                raise ValueError("a task without an environment must supply prompt_ids")
            prompt = list(spec.prompt_ids)
        else:
            opened = await self.env.open_session(self.environment, spec.messages, spec.env_args)
            r.session_id = opened.session_id
            prompt = opened.prompt_ids
        r.start(prompt)
        for turn in range(lim.max_turns):
            max_new = min(lim.per_turn_cap, r.remaining)
            if max_new < 1:
                r.truncate(TruncationCause.LENGTH)
                return
            res = await self.scheduler.submit(GenRequest(
                prompt_ids=list(r.ids), max_new=max_new, stop_token_ids=self.stop_token_ids,
                temperature=lim.temperature, key=key, turn=turn,
            ))
            if res.logprobs is None or len(res.logprobs) != len(res.ids):
                got = "none" if res.logprobs is None else len(res.logprobs)
                r.abort(f"backend returned {got} logprobs for {len(res.ids)} tokens")
                return
            if not all(math.isfinite(x) for x in res.logprobs):
                r.abort("backend returned non-finite logprobs")
                return
            if not res.ids:
                r.abort("backend generated no tokens")
                return
            rec = r.append_generated(res.ids, res.logprobs, res.finish_reason, max_new)
            if res.finish_reason is FinishReason.LENGTH:
                # Cut mid-turn: a half-written tool call must not run.
                r.truncate(TruncationCause.LENGTH)
                return
            if self.env is None:
                r.complete()
                return
            max_suffix = r.remaining - lim.reserve
            # No room is a real budget of zero, never "no limit" (None).
            step = await self.env.step(r.session_id, turn + 1, res.ids, max(0, max_suffix))
            rec.step_status = step.status
            rec.tool_calls = len(step.tool_calls)
            rec.tool_truncated = step.truncated
            rec.tools_ms = step.timing.tools_ms
            # The status is the one authority: OK goes on, every other status ends the rollout.
            match step.status:
                case StepStatus.OK if len(step.suffix_ids) > max_suffix:
                    # More than the budget (a server that reads 0 as "no limit" sends it all):
                    # the trainer enforces the budget itself.
                    r.truncate(TruncationCause.TOOL_OVERFLOW)
                    return
                case StepStatus.OK if turn == lim.max_turns - 1:
                    # Last allowed turn: the episode goes on, but we stop here (suffix not appended).
                    r.truncate(TruncationCause.MAX_TURNS)
                    return
                case StepStatus.OK:
                    r.append_env(step.suffix_ids)
                case StepStatus.EPISODE_END:
                    r.complete(step.reward)
                    return
                case StepStatus.SUFFIX_OVERFLOW:
                    r.truncate(TruncationCause.TOOL_OVERFLOW)
                    return
                case StepStatus.SANDBOX_LOST:
                    r.abort(f"sandbox lost: {step.detail or 'no detail'}")
                    return
                case _:  # ERROR (or UNSPECIFIED): the session is over mid-episode
                    r.abort(f"Step {step.status.name}: {step.detail or 'no detail'}")
                    return

    async def run_with_retries(self, spec: RolloutSpec, index: int, stats: BatchStats) -> Rollout | None:
        """Retry aborted rollouts from scratch (a new Rollout, a new session); None if dropped."""
        for attempt in range(self.limits.retries + 1):
            stats.attempts += 1
            r = await self.run_one(spec, RolloutKey(index, attempt))
            if r.status is not Status.ABORTED:
                return r
            stats.aborted_attempts += 1
            stats.abort_reasons.append(r.abort_reason or "")
        stats.dropped += 1
        return None

    async def run_batch(self, specs: list[RolloutSpec]) -> tuple[list[Rollout], BatchStats]:
        """Every spec's rollout, concurrently; the dropped ones are left out, the rest keep the order."""
        stats = BatchStats()
        results = await asyncio.gather(*(self.run_with_retries(s, i, stats) for i, s in enumerate(specs)))
        if stats.dropped:
            log.warning("dropped %d of %d rollouts after %d retries (reasons: %s)", stats.dropped,
                        len(specs), self.limits.retries, sorted(set(stats.abort_reasons))[:5])
        return [r for r in results if r is not None], stats


async def run_rollouts(specs: list[RolloutSpec], backend: GenerationBackend, env: EnvClient | None,
                       environment: str, limits: RolloutLimits, stop_token_ids: list[int], *,
                       gen_batch_wait_s: float) -> tuple[list[Rollout], BatchStats]:
    """`RolloutRunner.run_batch` with a generation scheduler of its own, closed afterwards."""
    scheduler = GenerationScheduler(backend, max_wait_s=gen_batch_wait_s)
    try:
        return await RolloutRunner(limits, scheduler, env, environment, stop_token_ids).run_batch(specs)
    finally:
        await scheduler.close()
