"""The trainer's rollout loop: many rollouts as asyncio tasks, their generations batched, retries.

Each rollout is `tito.rollout.turns`' loop (generate, Step the session, append its suffix ids
verbatim, repeat; the turn rule decides every outcome). Generation requests from all rollouts
waiting at a turn are batched by `GenerationScheduler` (the backend runs off the event loop), so
one rollout's tool execution overlaps others' generation. A failed call aborts only its own
rollout, which is retried from a clean state and dropped after `retries`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from tito.client import AsyncSession, EnvironmentClient
from tito.rollout import turns
from tito.rollout.generation import GenerationBackend, GenRequest, GenResult, RolloutKey
from tito.rollout.state import AbortCause, Rollout, Status
from tito.types import Message
from trainer.config import TrainConfig

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
        if self.budget < 2:
            raise ValueError(f"invalid rollout limits: {self}")
        self.turn_limits()  # they check themselves

    def turn_limits(self) -> turns.TurnLimits:
        """The limits the turn rule applies (the budget is each rollout's own)."""
        return turns.TurnLimits(per_turn_cap=self.per_turn_cap, reserve=self.reserve, max_turns=self.max_turns)

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
    A backend with `continuous_batching` (vLLM) takes requests while it generates: each is handed
    to it at once and joins the running batch, so no batch waits for another.
    """

    def __init__(self, backend: GenerationBackend, max_wait_s: float = 0.02) -> None:
        self.backend = backend
        self.max_wait_s = max_wait_s
        self.active = 0
        self._pending: list[tuple[GenRequest, asyncio.Future]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.continuous = bool(getattr(backend, "continuous_batching", False))
        self._serving: set[asyncio.Task] = set()

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
            while not self.continuous and len(self._pending) < self.active and loop.time() < deadline:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), deadline - loop.time())
                except TimeoutError:
                    break
            batch, self._pending = self._pending, []
            if self.continuous:
                task = asyncio.create_task(self._serve(batch))
                self._serving.add(task)
                task.add_done_callback(self._serving.discard)
            else:
                await self._serve(batch)

    async def _serve(self, batch: list[tuple[GenRequest, asyncio.Future]]) -> None:
        try:
            results = await self.backend.generate([r for r, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"backend returned {len(results)} results for {len(batch)}")
        except Exception as e:  # the rollouts abort; the scheduler keeps serving
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (_, fut), res in zip(batch, results):
            if not fut.done():
                fut.set_result(res)

    async def close(self) -> None:
        for task in list(self._serving):
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None


class RolloutRunner:
    def __init__(self, limits: RolloutLimits, scheduler: GenerationScheduler, env: EnvironmentClient | None,
                 environment: str, fingerprint: str, stop_token_ids: list[int], close_timeout_s: float = 30.0) -> None:
        self.limits = limits
        self.turn_limits = limits.turn_limits()
        self.scheduler = scheduler
        self.env = env
        self.environment = environment
        self.fingerprint = fingerprint
        self.stop_token_ids = tuple(stop_token_ids)
        self.close_timeout_s = close_timeout_s

    async def run_one(self, spec: RolloutSpec, key: RolloutKey) -> Rollout:
        """One attempt, from a clean state. Never raises for env or backend failures."""
        r = Rollout(budget=self.limits.budget, group=spec.group, attempt=key.attempt, meta=dict(spec.meta))
        session: AsyncSession | None = None
        self.scheduler.register()
        try:
            opened: list[int] | Exception = spec.prompt_ids or []
            if self.env is not None:
                try:
                    session = await self.env.open_session(self.environment, spec.messages,
                                                          fingerprint=self.fingerprint, env_args=spec.env_args)
                    r.session_id, opened = session.id, list(session.prompt_ids)
                except Exception as e:  # noqa: BLE001 - the rule aborts this rollout with the reason
                    opened = e
            if turns.start(r, opened):
                await self._turns(r, session, key)
        except asyncio.CancelledError:
            r.abort(AbortCause.CANCELLED)
            raise
        except Exception as e:  # a bug: loud in the log, but it costs this rollout only
            log.exception("rollout %s failed", key)
            r.abort(AbortCause.INTERNAL_ERROR, f"{type(e).__name__}: {e}")
        finally:
            self.scheduler.unregister()
            if r.abort_reason:
                log.warning("rollout %s aborted: %s", key, r.abort_reason)
            if session is not None:
                try:
                    await asyncio.wait_for(session.close(), self.close_timeout_s)
                except asyncio.TimeoutError:  # the server's idle TTL reclaims it anyway
                    log.warning("CloseSession(%s) got no answer within %gs (a loaded server or machine); the "
                                "server's idle TTL reclaims the session", session.id, self.close_timeout_s)
                except Exception as e:
                    log.warning("CloseSession(%s) failed: %s: %s", session.id, type(e).__name__, e)
        return r

    async def _turns(self, r: Rollout, session: AsyncSession | None, key: RolloutKey) -> None:
        """The turn rule's loop: generate, Step, until the rule ends the rollout."""
        lim = self.turn_limits
        while (max_new := turns.next_turn(r, lim)) is not None:
            try:
                res = await self.scheduler.submit(GenRequest(
                    prompt_ids=list(r.ids), max_new=max_new, stop_token_ids=self.stop_token_ids,
                    temperature=self.limits.temperature, key=key, turn=len(r.turns)))
            except Exception as e:  # the backend failed this batch: these rollouts abort, the rest go on
                res = GenResult.failed(f"{type(e).__name__}: {e}")
            if not turns.after_generation(r, res, max_new, stepping=session is not None):
                return
            assert session is not None
            try:
                answer: Any = await session.step(res.ids, max_suffix_tokens=turns.suffix_budget(r, lim))
            except Exception as e:  # noqa: BLE001 - the rule aborts this rollout with the reason
                answer = e
            if not turns.after_step(r, answer, lim):
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


async def run_rollouts(specs: list[RolloutSpec], backend: GenerationBackend, env: EnvironmentClient | None,
                       environment: str, fingerprint: str, limits: RolloutLimits, stop_token_ids: list[int], *,
                       gen_batch_wait_s: float) -> tuple[list[Rollout], BatchStats]:
    """`RolloutRunner.run_batch` with a generation scheduler of its own, closed afterwards."""
    scheduler = GenerationScheduler(backend, max_wait_s=gen_batch_wait_s)
    try:
        return await RolloutRunner(limits, scheduler, env, environment, fingerprint,
                                   stop_token_ids).run_batch(specs)
    finally:
        await scheduler.close()
