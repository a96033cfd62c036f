"""tito from slime (THUDM/slime): a custom generate function whose episodes are tito sessions.

    --custom-generate-function-path tito.integrations.slime.generate
    TITO_ADDRESS=host:port  TITO_ENVIRONMENT=python  TITO_MAX_TURNS=8  (environment variables of the rollout)

slime calls `await generate(args, sample, sampling_params)` per sample. The sample's `prompt` is the conversation
(a list of messages: do not pass --apply-chat-template; a plain string is one user message); its `metadata` may
carry `env_args` and `environment`. One episode: open a session (the server renders the prompt ids), then per turn
POST `{input_ids, sampling_params, return_logprob}` to SGLang's `/generate` with the family's stop ids and
`max_new_tokens` clamped to the context budget (`args.rollout_max_context_len`, else context_parallel_size x
max_tokens_per_gpu), Step the session with the ids generated, and append the server's suffix ids verbatim. The
turn rule is tito.rollout.turns, as in tito's trainer.

What slime reads back: `tokens` (prompt + response), `response_length`, `loss_mask` and `rollout_log_probs` (one
per response token: 1 and SGLang's logprob on generated ids, 0 and 0.0 on suffix ids), `response` (decoded, for
reward functions only; never re-tokenized), `status` (COMPLETED, TRUNCATED, or ABORTED for an infrastructure
failure, which slime does not score and hands back for a retry) and `reward` (the environment's; left None when it
gave none, so slime's reward model scores the sample). `metadata["tito"]` says how the episode ended.

NOT tested with slime's own code: slime is not on the package index and SGLang has no CPU build here
(docs/integrations.md). Its pure helpers (`parse_generate_output`, `sample_fields`) are unit-tested.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

from tito.client import TitoError
from tito.client.protocol import AsyncSession
from tito.integrations._clients import LoopClients
from tito.rollout import turns
from tito.rollout.generation import FinishReason, GenResult
from tito.rollout.state import Rollout, Status
from tito.rollout.turns import TurnLimits

# SGLang's finish_reason types: "stop" (a stop id, included in the output ids) and "length"; "abort" is failure.
_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}

_clients: dict[str, LoopClients] = {}


def parse_generate_output(output: Mapping[str, Any]) -> GenResult:
    """One SGLang `/generate` answer (with `return_logprob`) as a generation result: the ids and logprobs from
    `meta_info.output_token_logprobs` ([logprob, token_id, ...] per generated token), the finish type; a failed
    result (the rollout is aborted) for an abort, an unknown finish type or missing logprobs."""
    meta = output.get("meta_info") or {}
    finish = (meta.get("finish_reason") or {}).get("type")
    if finish not in _FINISH:
        return GenResult.failed(f"SGLang ended the turn with finish_reason {meta.get('finish_reason')!r}")
    pairs = meta.get("output_token_logprobs")
    if pairs is None:
        return GenResult.failed("SGLang returned no output_token_logprobs (the request needs return_logprob)")
    ids = [int(p[1]) for p in pairs]
    logprobs = [None if p[0] is None else float(p[0]) for p in pairs]
    if any(lp is None for lp in logprobs):
        return GenResult(ids=ids, logprobs=None, finish_reason=_FINISH[finish])
    return GenResult(ids=ids, logprobs=logprobs, finish_reason=_FINISH[finish])


def sample_fields(rollout: Rollout) -> dict[str, Any]:
    """The Sample fields of a finished rollout: tokens, response_length, loss_mask and rollout_log_probs (those two
    per response token), status (a `Sample.Status` value) and reward (the environment's, or None)."""
    if rollout.status is Status.RUNNING:
        raise ValueError("the rollout has not ended")
    p = rollout.prompt_len
    response_mask = rollout.mask[p:]
    return {
        "tokens": list(rollout.ids),
        "response_length": len(rollout.ids) - p,
        "loss_mask": list(response_mask),
        "rollout_log_probs": [lp if m else 0.0 for m, lp in zip(response_mask, rollout.logprobs[p:])],
        "status": {Status.COMPLETED: "completed", Status.TRUNCATED: "truncated",
                   Status.ABORTED: "aborted"}[rollout.status],
        "reward": rollout.env_reward,
    }


def context_budget(args: Any) -> int:
    """The episode's context budget, as slime's own multi-turn examples take it."""
    if getattr(args, "rollout_max_context_len", None):
        return int(args.rollout_max_context_len)
    return int(args.context_parallel_size) * int(args.max_tokens_per_gpu)


def messages_of(prompt: str | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) for m in prompt]


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    """slime's custom generate function (see the module's docstring)."""
    from slime.rollout.sglang_rollout import GenerateState
    from slime.utils.http_utils import post
    from slime.utils.types import Sample

    address = os.environ.get("TITO_ADDRESS")
    if not address:
        raise RuntimeError("TITO_ADDRESS is not set: export TITO_ADDRESS=host:port of the tito env server in the "
                           "rollout's environment (docs/integrations.md, slime)")
    state = GenerateState(args)
    clients = _clients.get(address)
    if clients is None:
        clients = _clients[address] = LoopClients(address, state.tokenizer)
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    limits = TurnLimits(per_turn_cap=int(sampling_params.get("max_new_tokens") or context_budget(args)),
                        reserve=int(os.environ.get("TITO_RESERVE", "0")),
                        max_turns=int(os.environ.get("TITO_MAX_TURNS", "8")))
    rollout = Rollout(budget=context_budget(args))
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    session: AsyncSession | None = None
    try:
        try:
            client, registration = await clients.get()
            session = await client.open_session(
                metadata.get("environment") or os.environ.get("TITO_ENVIRONMENT", "python"),
                messages_of(sample.prompt), fingerprint=registration.fingerprint, env_args=metadata.get("env_args"))
            prompt: Any = list(session.prompt_ids)
        except (TitoError, OSError) as e:
            prompt = e
        if turns.start(rollout, prompt):
            stop_ids = list(dict.fromkeys([*registration.stop_token_ids, *sampling_params.get("stop_token_ids", [])]))
            while (max_new := turns.next_turn(rollout, limits)) is not None:
                params = {**sampling_params, "max_new_tokens": max_new, "stop_token_ids": stop_ids}
                params.pop("stop", None)  # stop on ids only
                try:
                    result = parse_generate_output(await post(url, {"input_ids": list(rollout.ids),
                                                                    "sampling_params": params,
                                                                    "return_logprob": True}))
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # slime's post raises what the HTTP client raised
                    result = GenResult.failed(f"SGLang /generate failed: {type(e).__name__}: {e}")
                if not turns.after_generation(rollout, result, max_new):
                    break
                try:
                    answer: Any = await session.step(result.ids,
                                                     max_suffix_tokens=turns.suffix_budget(rollout, limits))
                except (TitoError, OSError) as e:
                    answer = e
                if not turns.after_step(rollout, answer, limits):
                    break
    finally:
        if session is not None:
            try:
                await asyncio.shield(session.close())
            except (TitoError, OSError):
                pass  # the lease's idle TTL ends it on the server
    fields = sample_fields(rollout)
    # A retried sample arrives with the state of its earlier try: every field below is set anew.
    sample.tokens = fields["tokens"] or list(sample.tokens or [])
    sample.response_length = fields["response_length"]
    sample.loss_mask = fields["loss_mask"]
    sample.rollout_log_probs = fields["rollout_log_probs"]
    sample.response = state.tokenizer.decode(rollout.ids[rollout.prompt_len:]) if rollout.prompt_len else ""
    sample.status = Sample.Status(fields["status"])
    sample.reward = fields["reward"]
    sample.metadata = {**metadata, "tito": rollout.summary()}
    return sample
