"""The generation backend interface shared by the transformers and vLLM backends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class GenRequest:
    prompt_ids: list[int]  # the rollout's whole context so far (token ids, never text)
    max_new: int
    stop_token_ids: tuple[int, ...]
    temperature: float = 1.0
    seed: int | None = None
    # Which rollout and turn asked (for scripted policies, logging); backends may ignore it.
    key: str = ""
    turn: int = 0


@dataclass
class GenResult:
    ids: list[int]
    # One logprob per generated id, under the sampling distribution (after temperature).
    # None or a short list means the backend could not provide them: the rollout is aborted.
    logprobs: list[float] | None
    finish_reason: str  # "stop" (ended on a stop token, included in ids) | "length"
    extra: dict = field(default_factory=dict)


@runtime_checkable
class GenerationBackend(Protocol):
    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Generate for a batch of requests (one result per request, same order)."""
        ...

    def sync_weights(self, model) -> None:
        """Make the next generate() use the training model's current weights."""
        ...


def finish_for(ids: list[int], max_new: int, stop_token_ids) -> str:
    """The finish reason implied by generated ids (shared by backends and tests)."""
    if ids and ids[-1] in set(stop_token_ids):
        return "stop"
    if len(ids) >= max_new:
        return "length"
    raise ValueError("generation ended without a stop token before max_new")
