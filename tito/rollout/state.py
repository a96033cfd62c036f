"""Rollout state: ids, loss mask and logprobs kept in one structure, always the same length.

Every mutation goes through a method that checks the invariant, so a rollout can never hold
misaligned sequences (the failure mode of parallel arrays patched in several places). What a
rollout does after each generation and each Step is decided in one place, `tito.rollout.turns`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tito.rollout.generation import FinishReason
from tito.types import StepStatus

# Placeholder logprob for positions the model did not generate (prompt and environment tokens).
# NaN, not 0.0, so that a bug that feeds them into the loss shows up loudly instead of silently.
NO_LOGPROB = float("nan")


class Status(str, enum.Enum):
    RUNNING = "running"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"


class TruncationCause(str, enum.Enum):
    LENGTH = "length"  # the budget ran out during generation (or before a turn could start)
    TOOL_OVERFLOW = "tool_overflow"  # the suffix the env rendered would not fit the budget
    MAX_TURNS = "max_turns"  # the turn limit was reached before the episode ended


class AbortCause(str, enum.Enum):
    """Why a rollout was aborted: its tokens are never trained on (the trainer retries it or drops it)."""

    BAD_PROMPT = "bad_prompt"  # the prompt is empty or does not fit the budget
    GENERATION_FAILED = "generation_failed"  # the backend raised, or could not serve this request
    NO_TOKENS = "no_tokens"  # the backend generated nothing
    MISSING_LOGPROBS = "missing_logprobs"  # not one logprob per generated token
    NONFINITE_LOGPROBS = "nonfinite_logprobs"
    INVALID_TURN = "invalid_turn"  # the turn breaks the rollout's invariants (more ids than asked, ...)
    ENV_CALL_FAILED = "env_call_failed"  # OpenSession or Step raised (server unreachable, refused, ...)
    SANDBOX_LOST = "sandbox_lost"  # Step status SANDBOX_LOST
    STEP_FAILED = "step_failed"  # Step status ERROR (or one this client does not know)
    CANCELLED = "cancelled"
    INTERNAL_ERROR = "internal_error"  # a bug in the loop (logged with its traceback); this rollout only


class RolloutStateError(RuntimeError):
    """A mutation that would break the rollout's invariants (a bug in the caller)."""


ENV_DETAIL_RECORD_CHARS = 2000


@dataclass
class TurnRecord:
    """What happened in one assistant turn (for metrics and debugging, never for training ids)."""

    index: int
    generated: int  # tokens generated this turn
    finish_reason: FinishReason
    max_new: int
    suffix_len: int = 0  # env tokens appended after the turn
    tool_calls: int = 0
    tool_truncated: bool = False  # the env cut some tool output to fit
    step_status: StepStatus | None = None  # when Step was called
    tools_ms: float = 0.0


@dataclass
class Rollout:
    """One episode. `ids`, `mask` and `logprobs` have equal length after every method call.

    mask: 1 for tokens the policy generated (trained on), 0 for prompt and environment tokens.
    logprobs: the sampler's logprob for generated tokens, NO_LOGPROB elsewhere.
    """

    budget: int
    group: int = 0  # index of the prompt group (GRPO)
    attempt: int = 0  # 0 for the first try; a retry is a new Rollout with attempt + 1
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_len: int = 0
    turns: list[TurnRecord] = field(default_factory=list)
    status: Status = Status.RUNNING
    truncation: TruncationCause | None = None
    abort_cause: AbortCause | None = None
    abort_reason: str | None = None  # "<cause>: <detail>", for logs and metrics
    env_reward: float | None = None  # reward reported by the environment, if any
    env_detail: str = ""  # what the environment said of the end (StepResult.detail: e.g. the tests' verdict)
    reward: float | None = None  # final reward used for training
    session_id: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # task data (e.g. the expected answer)

    # ------------------------------------------------------------------ queries
    @property
    def remaining(self) -> int:
        return self.budget - len(self.ids)

    @property
    def num_generated(self) -> int:
        return sum(self.mask)

    @property
    def tool_calls(self) -> int:
        return sum(t.tool_calls for t in self.turns)

    @property
    def finished(self) -> bool:
        return self.status is not Status.RUNNING

    def last_turn_ids(self) -> list[int]:
        """The ids generated in the last turn (the final answer when the episode completed)."""
        if not self.turns:
            return []
        end = len(self.ids)
        # The last turn is the last run of mask-1 tokens (a suffix may follow it).
        while end > 0 and self.mask[end - 1] == 0:
            end -= 1
        start = end - self.turns[-1].generated
        return self.ids[start:end]

    def check(self) -> None:
        """Raise if the invariants do not hold (used by tests and after every mutation)."""
        n = len(self.ids)
        if len(self.mask) != n or len(self.logprobs) != n:
            raise RolloutStateError(
                f"misaligned rollout: ids={n} mask={len(self.mask)} logprobs={len(self.logprobs)}"
            )
        if n > self.budget:
            raise RolloutStateError(f"rollout holds {n} tokens, over its budget of {self.budget}")
        for i, (m, lp) in enumerate(zip(self.mask, self.logprobs)):
            if m == 1 and not math.isfinite(lp):
                raise RolloutStateError(f"generated token at {i} has logprob {lp}")
        if self.status is Status.TRUNCATED and self.truncation is None:
            raise RolloutStateError("truncated rollout without a cause")
        if self.status is Status.ABORTED and (self.abort_cause is None or not self.abort_reason):
            raise RolloutStateError("aborted rollout without a reason")

    # ------------------------------------------------------------------ mutations
    def _require_running(self, what: str) -> None:
        if self.status is not Status.RUNNING:
            raise RolloutStateError(f"cannot {what}: rollout is {self.status.value}")

    def start(self, prompt_ids: Sequence[int]) -> None:
        self._require_running("set the prompt")
        if self.ids:
            raise RolloutStateError("prompt already set; a retry must start from a new Rollout")
        if not prompt_ids:
            raise RolloutStateError("empty prompt")
        if len(prompt_ids) > self.budget:
            raise RolloutStateError(
                f"prompt of {len(prompt_ids)} tokens does not fit the budget of {self.budget}"
            )
        self.ids = list(prompt_ids)
        self.mask = [0] * len(prompt_ids)
        self.logprobs = [NO_LOGPROB] * len(prompt_ids)
        self.prompt_len = len(prompt_ids)

    def append_generated(
        self, ids: list[int], logprobs: list[float], finish_reason: FinishReason, max_new: int
    ) -> TurnRecord:
        """Append one assistant turn as generated (mask 1). Validates before touching state."""
        self._require_running("append generated tokens")
        if not self.ids:
            raise RolloutStateError("append_generated before start()")
        if len(ids) != len(logprobs):
            raise RolloutStateError(f"{len(ids)} generated ids but {len(logprobs)} logprobs")
        if not all(math.isfinite(lp) for lp in logprobs):
            raise RolloutStateError("generated logprobs contain non-finite values")
        if len(ids) > max_new:
            raise RolloutStateError(f"backend generated {len(ids)} tokens, max_new was {max_new}")
        if len(ids) > self.remaining:
            raise RolloutStateError(
                f"{len(ids)} generated tokens do not fit the {self.remaining} left in the budget"
            )
        if not isinstance(finish_reason, FinishReason):
            raise RolloutStateError(f"unknown finish_reason {finish_reason!r}")
        self.ids.extend(ids)
        self.mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)
        turn = TurnRecord(
            index=len(self.turns), generated=len(ids), finish_reason=finish_reason, max_new=max_new
        )
        self.turns.append(turn)
        return turn

    def append_env(self, suffix_ids: Sequence[int]) -> None:
        """Append environment-rendered ids verbatim (mask 0). Refuses to overflow the budget."""
        self._require_running("append environment tokens")
        if not self.turns:
            raise RolloutStateError("environment tokens before any generated turn")
        if len(suffix_ids) > self.remaining:
            raise RolloutStateError(
                f"suffix of {len(suffix_ids)} tokens does not fit the {self.remaining} left"
            )
        self.ids.extend(suffix_ids)
        self.mask.extend([0] * len(suffix_ids))
        self.logprobs.extend([NO_LOGPROB] * len(suffix_ids))
        self.turns[-1].suffix_len += len(suffix_ids)

    def complete(self, env_reward: float | None = None, env_detail: str = "") -> None:
        self._require_running("complete")
        self.status = Status.COMPLETED
        self.env_reward = env_reward
        self.env_detail = env_detail

    def truncate(self, cause: TruncationCause) -> None:
        self._require_running("truncate")
        self.status = Status.TRUNCATED
        self.truncation = cause

    def abort(self, cause: AbortCause, detail: str = "") -> bool:
        """Mark a running rollout aborted. A finished rollout stays finished (a late failure,
        e.g. CloseSession raising, does not invalidate tokens already collected)."""
        if self.status is not Status.RUNNING:
            return False
        if not isinstance(cause, AbortCause):
            raise RolloutStateError(f"unknown abort cause {cause!r}")
        self.status = Status.ABORTED
        self.abort_cause = cause
        self.abort_reason = f"{cause.value}: {detail}" if detail else cause.value
        return True

    def summary(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "truncation": self.truncation.value if self.truncation else None,
            "abort_cause": self.abort_cause.value if self.abort_cause else None,
            "abort_reason": self.abort_reason,
            "len": len(self.ids),
            "prompt_len": self.prompt_len,
            "generated": self.num_generated,
            "turns": len(self.turns),
            "tool_calls": self.tool_calls,
            "reward": self.reward,
            "attempt": self.attempt,
            # The record's share of what the environment said of the end (a coding episode's test verdict first).
            "env_detail": self.env_detail[:ENV_DETAIL_RECORD_CHARS],
        }
