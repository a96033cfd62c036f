"""tito from AReaL: a `RolloutWorkflow` whose episodes are tito sessions (docs/integrations.md, "AReaL").

    from tito.integrations.areal import TitoWorkflow
    workflow = TitoWorkflow("127.0.0.1:50051", tokenizer, gconfig, environment="python", max_turns=4)
    batch = engine.rollout_batch(rows, workflow=workflow, group_size=8)   # or engine.prepare_batch(...)

Each row is `{"messages": [...], "env_args": {...}}` (optional `"environment"`). One episode: open a session (the
server renders the prompt ids), then per turn `engine.agenerate` with the family's stop ids and `max_new_tokens`
clamped to what `gconfig.max_tokens` (the episode's context budget) leaves, Step the session with the ids
generated, and append the server's suffix ids verbatim. The turn rule is tito.rollout.turns, as in tito's trainer.

The row AReaL trains on: `input_ids, logprobs, loss_mask, versions, rewards, attention_mask`, each (1, L) (rewards
(1,)); loss_mask 1 exactly on generated ids; logprobs and versions the engine's there, 0.0 and -1 on prompt and
suffix ids; rewards the environment's (0.0 when it gave none, or `reward_fn`'s). A rollout cut by the budget is
kept (AReaL trains on it) and counted in the stats as truncated; an aborted one (the env server or the engine
failed, a prompt over the budget) is None: AReaL rejects it, never trains on it as a reward of 0.

Needs AReaL (`areal`) and torch beside the client (`pip install .`); nothing of tito's server or trainer.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any

try:
    import torch
    from areal.api.cli_args import GenerationHyperparameters
    from areal.api.io_struct import ModelRequest
    from areal.api.workflow_api import RolloutWorkflow
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"tito.integrations.areal needs AReaL and torch ({e}): pip install areal, then the tito client "
                      "(`pip install .` in tito's repository); docs/integrations.md says how on a CPU machine") from e

from tito.client import TitoError
from tito.client.protocol import AsyncSession
from tito.integrations._clients import LoopClients
from tito.rollout import turns
from tito.rollout.generation import FinishReason, GenResult
from tito.rollout.state import Rollout, Status
from tito.rollout.turns import TurnLimits
from tito.types import TokenizerRegistration

log = logging.getLogger(__name__)

# AReaL's stop reasons: "stop" and "tool_calls" ended on a stop id, "length" on max_new_tokens.
_FINISH = {"stop": FinishReason.STOP, "tool_calls": FinishReason.STOP, "length": FinishReason.LENGTH}


class TitoWorkflow(RolloutWorkflow):
    """AReaL episodes driven by a tito environment server.

    `address`: the server (host:port). `tokenizer`: the policy's tokenizer (a transformers tokenizer, or its
    folder), registered once per event loop and checked by fingerprint. `gconfig`: AReaL's generation settings;
    `max_tokens` is the episode's whole context budget, `max_new_tokens` the cap of one turn; stop strings are
    refused (tito stops on token ids only). `reserve`: tokens a tool suffix must leave for the next turn.
    `reward_fn(rollout, row) -> float`: the reward where the environment gives none (default 0.0).
    `client_kwargs`: passed to `AsyncTitoClient` (tls, token, retries, deadline_s).
    """

    def __init__(self, address: str, tokenizer: Any, gconfig: GenerationHyperparameters, *,
                 environment: str = "python", max_turns: int = 8, reserve: int = 0,
                 env_args: Mapping[str, Any] | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
                 reward_fn: Callable[[Rollout, dict[str, Any]], float] | None = None,
                 client_kwargs: Mapping[str, Any] | None = None) -> None:
        if gconfig.stop:
            raise ValueError(f"gconfig.stop={gconfig.stop!r}: tito stops generation on token ids only (the family's "
                             "end-of-turn ids, added for you); set gconfig.stop to None")
        if gconfig.n_samples != 1:
            raise ValueError(f"gconfig.n_samples={gconfig.n_samples}: one episode is one sample; sample a group "
                             "with rollout_batch(..., group_size=N) or prepare_batch(..., group_size=N)")
        self.address = address
        self.tokenizer = tokenizer
        self.gconfig = gconfig
        self.environment = environment
        self.limits = TurnLimits(per_turn_cap=gconfig.max_new_tokens, reserve=reserve, max_turns=max_turns)
        self.env_args = dict(env_args or {})
        self.reward_fn = reward_fn
        # One client (one grpc.aio channel) per event loop: AReaL runs workflows on its executor's own loop.
        self.clients = LoopClients(address, tokenizer, chat_template_kwargs=chat_template_kwargs,
                                   client_kwargs=client_kwargs)

    async def aclose(self) -> None:
        """Close the running loop's tito client (AReaL's executor loop: call it from a workflow's loop)."""
        await self.clients.close()

    # ------------------------------------------------------------------ one episode

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, torch.Tensor] | None:
        rollout = Rollout(budget=self.gconfig.max_tokens, meta=dict(data))
        versions: list[list[int]] = []  # the engine's weight version per generated id, one list per turn
        session: AsyncSession | None = None
        try:
            try:
                client, registration = await self.clients.get()
                session = await client.open_session(
                    data.get("environment", self.environment), data.get("messages", ()),
                    fingerprint=registration.fingerprint, env_args={**self.env_args, **data.get("env_args", {})})
                prompt: Any = list(session.prompt_ids)
            except (TitoError, OSError) as e:
                prompt = e
            if turns.start(rollout, prompt):
                await self._turns(engine, session, registration, rollout, versions)
        finally:
            if session is not None:
                await asyncio.shield(self._close(session))
        return self._row(rollout, versions, data)

    async def _turns(self, engine: Any, session: AsyncSession, registration: TokenizerRegistration,
                     rollout: Rollout, versions: list[list[int]]) -> None:
        stop_ids = list(dict.fromkeys([*registration.stop_token_ids, *self.gconfig.stop_token_ids]))
        rid = uuid.uuid4().hex  # one rid per episode: AReaL keeps its turns on one server (prefix cache)
        while (max_new := turns.next_turn(rollout, self.limits)) is not None:
            result, turn_versions = await self._generate(engine, rid, rollout, max_new, stop_ids)
            before = len(rollout.turns)
            going_on = turns.after_generation(rollout, result, max_new)
            if len(rollout.turns) > before:  # the turn was appended (also when it was then cut by length)
                versions.append(turn_versions)
            if not going_on:
                return
            try:
                answer: Any = await session.step(result.ids, max_suffix_tokens=turns.suffix_budget(rollout, self.limits))
            except (TitoError, OSError) as e:
                answer = e
            if not turns.after_step(rollout, answer, self.limits):
                return

    async def _generate(self, engine: Any, rid: str, rollout: Rollout, max_new: int,
                        stop_ids: list[int]) -> tuple[GenResult, list[int]]:
        gconfig = self.gconfig.new(n_samples=1, max_new_tokens=max_new, max_tokens=rollout.budget,
                                   stop_token_ids=stop_ids, stop=None)
        try:
            response = await engine.agenerate(ModelRequest(rid=rid, input_ids=list(rollout.ids), gconfig=gconfig))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the engine's own errors (HTTP, timeouts) vary by backend
            return GenResult.failed(f"engine.agenerate raised {type(e).__name__}: {e}"), []
        finish = _FINISH.get(response.stop_reason)
        if finish is None:
            return GenResult.failed(f"the engine ended the turn with stop_reason {response.stop_reason!r}"), []
        if len(response.output_versions) != len(response.output_tokens):
            return GenResult.failed(f"the engine returned {len(response.output_versions)} versions for "
                                    f"{len(response.output_tokens)} tokens"), []
        return (GenResult(ids=list(response.output_tokens), logprobs=list(response.output_logprobs),
                          finish_reason=finish), list(response.output_versions))

    @staticmethod
    async def _close(session: AsyncSession) -> None:
        try:
            await session.close()
        except (TitoError, OSError) as e:  # the lease's idle TTL ends it on the server anyway
            log.warning("CloseSession %s failed: %s", session.id, e)

    # ------------------------------------------------------------------ the row AReaL trains on

    def _row(self, rollout: Rollout, versions: list[list[int]], data: dict[str, Any]) -> dict[str, torch.Tensor] | None:
        if rollout.status is Status.ABORTED:
            log.warning("tito episode rejected (%s)", rollout.abort_reason)
            return None
        if rollout.status is Status.RUNNING:  # cannot happen: every turns.* path ends the rollout
            raise RuntimeError("tito episode ended while still running")
        reward = rollout.env_reward
        if reward is None:
            reward = float(self.reward_fn(rollout, data)) if self.reward_fn else 0.0
        rollout.reward = reward
        row = episode_row(rollout, versions)
        _record_stats(rollout)
        return row


def episode_row(rollout: Rollout, versions: list[list[int]]) -> dict[str, torch.Tensor]:
    """AReaL's trajectory dict of a finished rollout: (1, L) tensors, rewards (1,). Generated ids (mask 1) take
    their logprob and version, every other id logprob 0.0 and version -1 (AReaL's values for ids not sampled)."""
    flat = [v for turn in versions for v in turn]
    if len(flat) != rollout.num_generated:
        raise RuntimeError(f"{len(flat)} versions for {rollout.num_generated} generated ids")
    it = iter(flat)
    row_versions = [next(it) if m else -1 for m in rollout.mask]
    logprobs = [lp if m else 0.0 for m, lp in zip(rollout.mask, rollout.logprobs)]
    res = {
        "input_ids": torch.tensor(rollout.ids, dtype=torch.int32),
        "logprobs": torch.tensor(logprobs, dtype=torch.float32),
        "loss_mask": torch.tensor(rollout.mask, dtype=torch.int32),
        "versions": torch.tensor(row_versions, dtype=torch.int32),
        "rewards": torch.tensor(float(rollout.reward or 0.0), dtype=torch.float32),
        "attention_mask": torch.ones(len(rollout.ids), dtype=torch.bool),
    }
    return {k: v.unsqueeze(0) for k, v in res.items()}


def _record_stats(rollout: Rollout) -> None:
    """The episode's figures in AReaL's stats tracker (the scope its executor is in: rollout or eval-rollout)."""
    try:
        from areal import workflow_context
        from areal.utils import stats_tracker

        stats_tracker.get(workflow_context.stat_scope()).scalar(
            reward=float(rollout.reward or 0.0), num_turns=len(rollout.turns), tool_calls=rollout.tool_calls,
            truncated=float(rollout.status is Status.TRUNCATED))
    except Exception as e:  # stats are not worth an episode
        log.debug("stats not recorded: %s", e)
