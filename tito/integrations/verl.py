"""tito as a verl agent loop: verl's rollout workers drive episodes on a tito environment server.

verl (0.9.1) loads it from its agent-loop yaml (`actor_rollout_ref.rollout.agent.agent_loop_config_path`):

    - name: tito
      _target_: tito.integrations.verl.TitoAgentLoop
      address: 127.0.0.1:50051         # or TITO_ADDRESS
      environment: python              # a row's extra_info.tito.environment wins
      env_args: {}                     # merged under a row's extra_info.tito.env_args

and a dataset row picks it with `agent_name: tito` (or `rollout.agent.default_agent_loop: tito`). Per sample
the loop opens a session with the row's `raw_prompt`, generates through verl's `server_manager` (token ids in
and out, the family's stop ids from RegisterTokenizer, each turn's `max_tokens` clamped to what is left of
`rollout.response_length`), Steps the session, appends the server's suffix ids verbatim (mask 0, logprob 0)
and hands the environment's reward as `reward_score`. The turn rule is `tito.rollout.turns`, the trainer's own:
a turn cut by length runs no tools, a suffix that would pass the budget ends the rollout truncated.

Failures: verl's `AgentLoopOutput` has no field for a sample that could not be produced, and verl's own loops
raise when their inference server fails. So a rollout tito aborts (the env server unreachable, a sandbox lost,
no logprobs, a prompt longer than `rollout.prompt_length`) raises `TitoRolloutError` with the cause: verl's
`generate_sequences` fails loudly instead of training on a made-up reward of 0. Sessions are closed on every path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from collections.abc import Mapping
from typing import Any

from tito.client import AsyncTitoClient
from tito.integrations._clients import LoopClients
from tito.rollout import turns
from tito.rollout.generation import FinishReason, GenResult
from tito.rollout.state import AbortCause, Rollout, Status
from tito.rollout.turns import TurnLimits
from tito.types import TokenizerRegistration

try:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput
except ImportError as e:  # pragma: no cover - depends on the user's environment
    raise ImportError(f"tito.integrations.verl needs verl (pip install verl; tested with 0.9.1): {e}") from None

log = logging.getLogger(__name__)


class TitoRolloutError(RuntimeError):
    """A rollout tito aborted (never trained on): `cause` is a `tito.rollout.AbortCause` value."""

    def __init__(self, cause: str, reason: str, session_id: str | None) -> None:
        super().__init__(f"tito rollout aborted ({reason}); session {session_id or '-'}")
        self.cause = cause
        self.reason = reason
        self.session_id = session_id


# One LoopClients (a client per worker event loop, registered once) per (address, token, tokenizer, template
# kwargs): a row may name a tokenizer folder of its own.
_CLIENTS: dict[tuple, LoopClients] = {}


def _loop_clients(address: str, token: str | None, key: Any, tokenizer: Any,
                  chat_template_kwargs: Mapping[str, Any]) -> LoopClients:
    found = _CLIENTS.get((address, token, key))
    if found is None:
        found = _CLIENTS[(address, token, key)] = LoopClients(
            address, tokenizer, chat_template_kwargs=chat_template_kwargs, client_kwargs={"token": token})
    return found


def _row_settings(extra_info: Any) -> dict[str, Any]:
    """A row's `extra_info.tito` ({environment, env_args, tokenizer_path}); env_args may be JSON text (parquet
    columns of dicts with differing keys are awkward)."""
    tito = dict((extra_info or {}).get("tito") or {})
    env_args = tito.get("env_args")
    if isinstance(env_args, str):
        try:
            env_args = json.loads(env_args)
        except json.JSONDecodeError as e:
            raise ValueError(f"extra_info.tito.env_args is not JSON ({e}): give a dict or its JSON text") from None
    if env_args is not None and not isinstance(env_args, Mapping):
        raise ValueError(f"extra_info.tito.env_args must be a dict (or its JSON text), not {type(env_args).__name__}")
    tito["env_args"] = {k: v for k, v in (env_args or {}).items() if v is not None}
    return tito


def _messages(raw_prompt: Any) -> list[dict[str, Any]]:
    if raw_prompt is None or len(raw_prompt) == 0:
        raise ValueError("the row has no raw_prompt (a list of chat messages): verl's RLHFDataset keeps it with "
                         "data.return_raw_chat=True")
    return [{k: v for k, v in dict(m).items() if v is not None} for m in raw_prompt]


class TitoAgentLoop(AgentLoopBase):
    """A verl agent loop whose environment is a tito server (see the module docstring for the yaml)."""

    def __init__(self, *args: Any, address: str | None = None, environment: str | None = None,
                 env_args: Mapping[str, Any] | None = None, tokenizer_path: str | None = None,
                 chat_template_kwargs: Mapping[str, Any] | None = None, token: str | None = None,
                 max_turns: int | None = None, max_tokens_per_turn: int | None = None, reserve_tokens: int = 0,
                 truncated_reward: float | None = 0.0,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.address = address or os.environ.get("TITO_ADDRESS") or "127.0.0.1:50051"
        self.environment = environment
        self.env_args = dict(env_args or {})
        # A tokenizer folder to register; default: verl's own tokenizer (the policy's). Not `tokenizer`: verl
        # passes its tokenizer object under that name.
        self.tokenizer_source = tokenizer_path
        self.chat_template_kwargs = dict(chat_template_kwargs or self.apply_chat_template_kwargs or {})
        self.token = token or os.environ.get("TITO_TOKEN")
        multi_turn = self.rollout_config.get("multi_turn", {}) or {}
        self.max_turns = int(max_turns or multi_turn.get("max_assistant_turns") or 16)
        self.reserve_tokens = reserve_tokens
        self.max_tokens_per_turn = max_tokens_per_turn
        self.truncated_reward = truncated_reward
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)

    async def _client(self, source: str | None) -> tuple[AsyncTitoClient, TokenizerRegistration]:
        """The running loop's client for this address and token, registered with `source` (a tokenizer folder)
        or verl's own tokenizer."""
        key = (source or id(self.tokenizer), json.dumps(self.chat_template_kwargs, sort_keys=True, default=str))
        return await _loop_clients(self.address, self.token, key, source or self.tokenizer,
                                   self.chat_template_kwargs).get()

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        row = _row_settings(kwargs.get("extra_info"))
        environment = row.get("environment") or self.environment
        if not environment:
            raise ValueError("no tito environment: set `environment:` in the agent-loop yaml or "
                             "extra_info.tito.environment in the row")
        messages = _messages(kwargs.get("raw_prompt"))
        client, registration = await self._client(row.get("tokenizer_path") or self.tokenizer_source)
        # The rollout's budget is the prompt plus rollout.response_length: generated and suffix ids share it.
        limits = TurnLimits(per_turn_cap=self.max_tokens_per_turn or self.response_length,
                            reserve=self.reserve_tokens, max_turns=self.max_turns)
        session = None
        rollout: Rollout | None = None
        try:
            session = await client.open_session(
                environment, messages, fingerprint=registration.fingerprint,
                env_args={**self.env_args, **row["env_args"]})
            prompt = list(session.prompt_ids)
            rollout = Rollout(budget=len(prompt) + self.response_length, session_id=session.id)
            if len(prompt) > self.prompt_length:
                # verl pads prompts to rollout.prompt_length and cannot hold a longer one; cutting it would
                # train on ids the server did not render.
                raise TitoRolloutError("bad_prompt", (
                    f"bad_prompt: the session's prompt has {len(prompt)} tokens, more than rollout.prompt_length="
                    f"{self.prompt_length}; raise data.max_prompt_length or shorten the task"), session.id)
            if turns.start(rollout, prompt):
                await self._turns(rollout, session, registration, sampling_params, limits)
        except TitoRolloutError:
            raise
        except Exception as e:  # OpenSession failed, or a bug in this loop: aborted, never trained on
            rollout = rollout or Rollout(budget=1)
            cause = AbortCause.ENV_CALL_FAILED if session is None else AbortCause.INTERNAL_ERROR
            if cause is AbortCause.INTERNAL_ERROR:
                log.exception("tito: rollout aborted by an error in the agent loop")
            rollout.abort(cause, f"{type(e).__name__}: {e}")
        finally:
            if session is not None:
                try:
                    await asyncio.shield(session.close())
                except Exception as e:  # the lease ends it; the tokens already collected stay valid
                    log.warning("tito: closing session %s failed: %s", session.id, e)
        return self._output(rollout, len(messages))

    async def _turns(self, rollout: Rollout, session: Any, registration: TokenizerRegistration,
                     sampling_params: dict[str, Any], limits: TurnLimits) -> None:
        request_id = uuid.uuid4().hex  # one id per rollout: verl routes its turns to one server (prefix cache)
        stop = set(registration.stop_token_ids)
        while (max_new := turns.next_turn(rollout, limits)) is not None:
            params = {**sampling_params, "max_tokens": max_new, "logprobs": True,
                      "stop_token_ids": sorted(stop | set(sampling_params.get("stop_token_ids") or ()))}
            try:
                out = await self.server_manager.generate(request_id, prompt_ids=list(rollout.ids),
                                                         sampling_params=params)
                result = _gen_result(out, stop, max_new)
            except Exception as e:
                result = GenResult.failed(f"server_manager.generate raised {type(e).__name__}: {e}")
            if not turns.after_generation(rollout, result, max_new):
                break
            try:
                answer = await session.step(rollout.last_turn_ids(),
                                            max_suffix_tokens=turns.suffix_budget(rollout, limits))
            except Exception as e:
                answer = e
            if not turns.after_step(rollout, answer, limits):
                break

    def _output(self, rollout: Rollout, opening_messages: int) -> AgentLoopOutput:
        if rollout.status is Status.ABORTED:
            raise TitoRolloutError(rollout.abort_cause.value, rollout.abort_reason or "", rollout.session_id)
        prompt_len = rollout.prompt_len
        tool_turns = sum(1 for t in rollout.turns if t.suffix_len)
        if rollout.status is Status.COMPLETED:
            reward = rollout.env_reward
        else:
            reward = self.truncated_reward
        return AgentLoopOutput(
            prompt_ids=rollout.ids[:prompt_len],
            response_ids=rollout.ids[prompt_len:],
            response_mask=rollout.mask[prompt_len:],
            # verl pads logprobs with 0.0 and reads them only where the mask is 1.
            response_logprobs=[lp if m else 0.0 for lp, m in zip(rollout.logprobs[prompt_len:],
                                                                 rollout.mask[prompt_len:])],
            reward_score=reward,
            num_turns=opening_messages + len(rollout.turns) + tool_turns,
            metrics=AgentLoopMetrics(),
            extra_fields={"tito_status": rollout.status.value,
                          "tito_truncation": rollout.truncation.value if rollout.truncation else None,
                          "tito_tool_calls": rollout.tool_calls, "tito_session": rollout.session_id},
        )


def _gen_result(out: Any, stop: set[int], max_new: int) -> GenResult:
    """verl's TokenOutput as a tito GenResult. verl reports `completed` for both a stop and a length cut,
    so the finish reason comes from the ids: a last id among the stop ids is a stop, anything else a cut."""
    if getattr(out, "stop_reason", None) in ("aborted", "abort"):
        return GenResult.failed("the inference server aborted the request (verl stop_reason 'aborted')")
    ids = list(out.token_ids)
    logprobs = None if out.log_probs is None else [float(x) for x in out.log_probs]
    finish = FinishReason.STOP if ids and ids[-1] in stop else FinishReason.LENGTH
    if finish is FinishReason.LENGTH and len(ids) < max_new:
        log.info("tito: generation ended after %d of %d tokens without a stop id (the server's context limit?)",
                 len(ids), max_new)
    return GenResult(ids=ids, logprobs=logprobs, finish_reason=finish)
