"""What a generation backend is: one protocol, its request and result, and why a generation ended.

The trainer's backends (transformers, vLLM, scripted) implement `GenerationBackend`; TRL's engines are
driven through the same `GenRequest`/`GenResult` by `tito.trl.generation`. `tito.rollout.turns`
decides what a rollout does with a `GenResult`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class FinishReason(enum.IntEnum):
    """Why one generation call ended (as vLLM's `RequestFinishedReason`).

    There is no ABORT: a backend that cannot finish a request raises, and the rollout that asked
    is aborted by the rollout loop.
    """

    STOP = 0  # ended on one of the request's stop token ids (included in ids)
    LENGTH = 1  # reached max_new without a stop token: the turn was cut


@dataclass(frozen=True)
class RolloutKey:
    """Which rollout a generation request belongs to: its spec's index in the batch and the
    attempt (0 first, one more per retry). Scripted policies pick their turns by it."""

    spec: int
    attempt: int = 0

    def __str__(self) -> str:
        return f"r{self.spec}#{self.attempt}"


@dataclass(frozen=True)
class GenRequest:
    prompt_ids: list[int]  # the rollout's whole context so far (token ids, never text)
    max_new: int
    stop_token_ids: tuple[int, ...]
    temperature: float = 1.0
    seed: int | None = None  # this request's own sampling seed (see backends/seeding.py)
    # Which rollout and turn asked (for scripted policies, logging); backends may ignore it.
    key: RolloutKey | None = None
    turn: int = 0


@dataclass
class GenResult:
    ids: list[int]
    # One logprob per generated id, under the sampling distribution (after temperature).
    # None or a short list means the backend could not provide them: the rollout is aborted.
    logprobs: list[float] | None
    finish_reason: FinishReason
    # Set when the backend could not serve this request (no ids): why. The rollout is aborted.
    error: str = ""

    @classmethod
    def failed(cls, reason: str) -> GenResult:
        return cls(ids=[], logprobs=None, finish_reason=FinishReason.STOP, error=reason or "unknown error")


@runtime_checkable
class GenerationBackend(Protocol):
    """What generates a rollout's turns. A backend may also set `continuous_batching = True`: then
    generate() may be called again before an earlier call returns, and the new requests join the
    batch it is running (the trainer's scheduler hands each request over at once)."""

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Generate for a batch of requests (one result per request, same order)."""
        ...

    def sync_weights(self, model) -> None:
        """Make the next generate() use the training model's current weights."""
        ...

    def release_memory(self) -> None:
        """Generation is over until the next sync_weights(): give back memory the training step
        needs (a colocated vLLM sleeps). A no-op for backends that share the training model."""
        ...
