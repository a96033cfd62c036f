"""`TitoRollout`: a ready `rollout_func` for TRL's GRPOTrainer that keeps every tito guarantee.

    tito = TitoRollout("127.0.0.1:50051", tokenizer, environment="python", max_turns=3, max_tokens_per_turn=256)
    dataset = tito.attach(dataset, env_args=lambda row: {"expected_answer": row["answer"]})
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=GRPOConfig(...), train_dataset=dataset,
                          rollout_func=tito.rollout_func, reward_funcs=tito.reward_func)

tito renders the prompt (with the environment's own tool schema) and, after each tool turn, the
suffix ids; the policy's ids and tito's ids are concatenated as they are, never decoded and
re-encoded. The trainer's model (or TRL's vLLM) generates each turn with
`max_new = min(max_tokens_per_turn, remaining budget)`, stopping on tito's stop ids. The Steps of
one turn of all rollouts go to the server together, so their tools run in parallel.

Use it WITHOUT `tools=` / `environment_factory=`: with either, TRL ignores `env_mask` and runs its
own tool loop on top (checked on the first call). With TRL's vLLM on vLLM's CPU build, call
`tito.trl.vllm_cpu.patch()` before building the trainer (checked for colocate). `rollout_func` is
experimental in TRL 1.16 and warns unless `TRL_EXPERIMENTAL_SILENCE=1`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tito.client import AsyncSession, TitoClient
from tito.extras import require
from tito.fingerprint import compute_fingerprint
from tito.rollout import turns
from tito.rollout.generation import GenRequest
from tito.rollout.state import Rollout as RolloutState
from tito.rollout.state import Status
from tito.tokenizer_files import tokenizer_files
from tito.trl._common import (ABORTED, COMPLETED, EnvClock, attempt, connect, log, log_status_metrics, status_reward,
                              truncated)
from tito.trl.generation import Generator, generator_for

# The key `attach` adds to a prompt's first message: rollout_func sees only prompts, so a row's
# environment arguments travel on its prompt (JSON text, so every row has the same Arrow type).
ENV_ARGS_KEY = "tito_env_args"

EnvArgsFn = Callable[[Mapping[str, Any]], Mapping[str, Any] | None]


def stamp_prompt(prompt: str | Sequence[Mapping[str, Any]], env_args: Mapping[str, Any] | None
                 ) -> list[dict[str, Any]]:
    """The prompt as chat messages, its first message carrying `env_args` as JSON."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if not messages:
        raise ValueError("an empty prompt: TitoRollout needs at least one message")
    messages[0][ENV_ARGS_KEY] = json.dumps(dict(env_args or {}))
    return messages


def split_prompt(prompt: str | Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The chat messages of a prompt TRL passes, and the env args `attach` stamped on it."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}], None
    messages, env_args = [], None
    for i, m in enumerate(prompt):
        m = dict(m)
        raw = m.pop(ENV_ARGS_KEY, None)
        if i == 0 and raw:
            env_args = json.loads(raw) or None
        # Arrow fills the fields a message lacks with None.
        messages.append({k: v for k, v in m.items() if v is not None})
    return messages, env_args


@dataclass
class _Episode:
    session: AsyncSession
    state: RolloutState

    @property
    def step_status(self) -> str | None:
        """The last Step's status name (None before the first Step)."""
        stepped = [t.step_status for t in self.state.turns if t.step_status is not None]
        return stepped[-1].name if stepped else None

    @property
    def tool_output_cut(self) -> bool:
        return any(t.tool_truncated for t in self.state.turns)

    @property
    def status(self) -> str:
        s = self.state
        if s.status is Status.TRUNCATED:
            return truncated(s.truncation.value if s.truncation else "length")
        return COMPLETED if s.status is Status.COMPLETED else ABORTED


class TitoRollout:
    """A `rollout_func` (and its `reward_func`) driving tito sessions from a GRPOTrainer.

    Args:
        address_or_client: the env server's "host:port", or a `tito.client.TitoClient` (not closed here).
        tokenizer: the trainer's tokenizer (its `processing_class`); registered with the server in
            compact form, its fingerprint checked, tito's stop ids taken from the answer.
        environment: the tito environment every rollout opens.
        max_turns: assistant turns per rollout; an episode still going after the last is
            `truncated:max_turns` (its last suffix is not appended).
        max_tokens_per_turn: the cap on new tokens of one assistant turn.
        max_completion_tokens: the completion budget (generated + suffix ids); defaults to the
            trainer's `max_completion_length`.
        suffix_reserve: tokens of budget a tool suffix leaves for the next turn (tito cuts the tool
            output head/tail to fit; if even that does not fit the rollout is `truncated:tool_overflow`).
        truncated_reward: the reward of a truncated rollout (None: TRL ignores it).
        chat_template_kwargs: passed to the template on the server (part of the fingerprint).
    """

    def __init__(self, address_or_client: str | TitoClient, tokenizer: Any, environment: str = "python", *,
                 max_turns: int = 4, max_tokens_per_turn: int = 256, max_completion_tokens: int | None = None,
                 suffix_reserve: int = 16, truncated_reward: float | None = 0.0,
                 chat_template_kwargs: Mapping[str, Any] | None = None, ready_timeout_s: float = 120.0) -> None:
        require("trl", "trl", "tito.trl.TitoRollout")  # generation goes through TRL's trainer (and torch)
        self.environment = environment
        self.limits = turns.TurnLimits(per_turn_cap=max_tokens_per_turn, reserve=suffix_reserve, max_turns=max_turns)
        self.max_completion_tokens = max_completion_tokens
        self.truncated_reward = truncated_reward
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.client, self._owns_client = connect(address_or_client, ready_timeout_s)
        try:
            self.client.environment(environment)  # an unknown name fails here, listing what the server has
            self.registration = self.client.register_tokenizer(tokenizer, self.chat_template_kwargs)
        except BaseException:
            self.close()
            raise
        self.stop_token_ids = tuple(self.registration.stop_token_ids)
        pad = getattr(tokenizer, "pad_token_id", None)
        self._pad_id = pad if pad is not None else self.stop_token_ids[0]
        self._checked_trainer: Any = None
        self._clock = EnvClock()

    # ------------------------------------------------------------------ public

    def attach(self, dataset: Any, env_args: EnvArgsFn | None = None) -> Any:
        """The dataset with each row's environment arguments stamped on its prompt (a string
        prompt becomes one user message). Works on `datasets.Dataset`s and lists of dicts."""
        def stamp(row: Mapping[str, Any]) -> dict[str, Any]:
            return {"prompt": stamp_prompt(row["prompt"], env_args(row) if env_args else None)}

        if hasattr(dataset, "map"):
            return dataset.map(stamp)
        return [{**row, **stamp(row)} for row in dataset]

    def rollout_func(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        """Called by GRPOTrainer with this process's prompts (already repeated `num_generations` times)."""
        self._check_trainer(trainer)
        budget = self.max_completion_tokens or trainer.max_completion_length
        generator = generator_for(trainer)
        sessions = self._open([split_prompt(p) for p in prompts])
        try:
            episodes = [_Episode(s, RolloutState(budget=len(s.prompt_ids) + budget)) for s in sessions]
            for e in episodes:
                turns.start(e.state, e.session.prompt_ids)
            with generator.active():
                self._run(episodes, generator)
        finally:
            self._close_sessions(sessions)
        aborted = [e.state.abort_reason for e in episodes if e.state.status is Status.ABORTED]
        if aborted and len(aborted) == len(episodes):
            raise RuntimeError(f"all {len(episodes)} rollouts of this batch aborted; the first: {aborted[0]}")
        return self._output(episodes)

    def reward_func(self, completions: list, tito_status: list[str] | None = None,
                    tito_reward: list[float | None] | None = None, tito_tool_calls: list[int] | None = None,
                    log_metric: Callable[[str, float], None] | None = None, **_: Any) -> list[float | None]:
        """The environment's reward of each rollout (see `truncated_reward`; None when aborted)."""
        if tito_status is None or tito_reward is None:
            raise ValueError("TitoRollout.reward_func reads the extras of TitoRollout.rollout_func: pass "
                             "rollout_func=tito.rollout_func to GRPOTrainer as well")
        log_status_metrics(log_metric, tito_status, tito_tool_calls or [], self._clock)
        return [status_reward(s, r, self.truncated_reward) for s, r in zip(tito_status, tito_reward, strict=True)]

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> TitoRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ checks

    def _check_trainer(self, trainer: Any) -> None:
        if self._checked_trainer is trainer:
            return
        if getattr(trainer, "tools", None) or getattr(trainer, "environment_factories", None) is not None:
            raise ValueError(
                "TitoRollout runs the tools itself, through tito: build the GRPOTrainer with "
                "rollout_func=tito.rollout_func and WITHOUT tools= or environment_factory= (with them TRL ignores "
                "env_mask and runs its own tool loop on top). For TRL's own tool loop use TitoEnvironmentSpec.")
        if getattr(trainer, "use_vllm", False) and trainer.vllm_generation.mode == "colocate":
            from tito.rollout.vllm import on_cpu_platform
            from tito.trl.vllm_cpu import is_patched

            if on_cpu_platform() and not is_patched(trainer.vllm_generation):
                raise RuntimeError(
                    "TRL's colocated vLLM runs on vLLM's CPU build here, which needs tito's engine settings and weight "
                    "push: call tito.trl.vllm_cpu.patch() before GRPOTrainer(...) (docs/trl.md)")
        tok = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        if tok is not self.tokenizer:
            mine = self.registration.fingerprint
            theirs = compute_fingerprint(tokenizer_files(tok), self.chat_template_kwargs)
            if theirs != mine:
                raise ValueError(
                    f"the trainer's processing_class (fingerprint {theirs[:12]}…) is not the tokenizer TitoRollout "
                    f"registered ({mine[:12]}…): tito would render ids of another tokenizer or chat template. Pass "
                    "the same tokenizer to TitoRollout and to GRPOTrainer(processing_class=...)")
        self._checked_trainer = trainer

    # ------------------------------------------------------------------ sessions

    def _open(self, specs: list[tuple[list[dict[str, Any]], dict[str, Any] | None]]) -> list[AsyncSession]:
        aio = self.client.aio
        opened = self._gather([attempt(aio.open_session(
            self.environment, messages, fingerprint=self.registration.fingerprint, env_args=env_args))
            for messages, env_args in specs])
        errors = [o for o in opened if isinstance(o, Exception)]
        if errors:
            # A bad row (env args the environment refuses, ...) is a data error: stop loudly.
            self._close_sessions([o for o in opened if not isinstance(o, Exception)])
            raise errors[0]
        return opened

    def _close_sessions(self, sessions: list[AsyncSession]) -> None:
        for s, r in zip(sessions, self._gather([attempt(s.close()) for s in sessions])):
            if isinstance(r, Exception):  # the server's lease reclaims it
                log.warning("CloseSession(%s) failed: %s", s.id, r)

    def _gather(self, calls: list) -> list:
        with self._clock.timing():
            return self.client.gather(calls)

    # ------------------------------------------------------------------ turns

    def _run(self, episodes: list[_Episode], generator: Generator) -> None:
        """The turn rule's loop, one turn of every running rollout at a time: their generations go to
        the engine as one batch, and their Steps to the server together (tools run in parallel). Each
        pass ends every running rollout or adds one turn to it, so max_turns passes end them all; a
        collective engine (every rank calls it equally often) is called on every pass, even with nothing."""
        for _ in range(self.limits.max_turns):
            batch = [(e, max_new) for e in episodes if (max_new := turns.next_turn(e.state, self.limits)) is not None]
            if not batch and not generator.collective:
                return
            results = generator.generate([GenRequest(prompt_ids=list(e.state.ids), max_new=max_new,
                                                     stop_token_ids=self.stop_token_ids, turn=len(e.state.turns))
                                          for e, max_new in batch])
            stepping = [(e, res) for (e, max_new), res in zip(batch, results, strict=True)
                        if turns.after_generation(e.state, res, max_new)]
            answers = self._gather([attempt(e.session.step(
                res.ids, max_suffix_tokens=turns.suffix_budget(e.state, self.limits))) for e, res in stepping])
            for (e, _), answer in zip(stepping, answers, strict=True):
                turns.after_step(e.state, answer, self.limits)

    def _output(self, episodes: list[_Episode]) -> dict[str, list]:
        out: dict[str, list] = {k: [] for k in (
            "prompt_ids", "completion_ids", "logprobs", "env_mask", "tito_status", "tito_reward",
            "tito_tool_calls", "tito_tool_output_cut", "tito_step_status", "tito_session_id", "tito_detail")}
        for e in episodes:
            r = e.state
            p = r.prompt_len
            ids, mask = r.ids[p:], r.mask[p:]
            if r.status is Status.ABORTED:
                mask = [0] * len(mask)  # never trained on, whatever TRL does with the reward
            logprobs = [lp if m else 0.0 for lp, m in zip(r.logprobs[p:], mask)]
            if not ids:  # TRL reads completion_ids[-1]: give it one inert token
                ids, mask, logprobs = [self._pad_id], [0], [0.0]
            out["prompt_ids"].append(r.ids[:p] if p else list(e.session.prompt_ids))
            out["completion_ids"].append(ids)
            out["logprobs"].append(logprobs)
            out["env_mask"].append(mask)
            out["tito_status"].append(e.status)
            out["tito_reward"].append(r.env_reward if r.status is Status.COMPLETED else None)
            out["tito_tool_calls"].append(r.tool_calls)
            out["tito_tool_output_cut"].append(e.tool_output_cut)
            out["tito_step_status"].append(e.step_status)
            out["tito_session_id"].append(e.session.id)
            out["tito_detail"].append(r.abort_reason or "")
        return out
