"""Per-request sampling seeds: each generation's randomness is a function of where it is in the
run, not of how the scheduler happened to batch it.

With one shared generator the samples depend on batch composition, which depends on timing (env
calls finish in any order), so two runs with the same seed differ and a resumed run cannot redo
the step it was killed in. Seeding every request from (run seed, step, prompt group, member of the
group, attempt, turn) fixes both, and since none of these depends on the rank, the same run on one
process or on several samples the same tokens. The backends honour `GenRequest.seed`
(transformers: a generator per row; vLLM: `SamplingParams.seed`).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from tito.rollout.generation import GenerationBackend, GenRequest, GenResult

if TYPE_CHECKING:
    from trainer.rollout import RolloutSpec


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (stable across processes and Python versions)."""
    digest = hashlib.blake2b(repr(tuple(int(p) for p in parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class StepSeeds:
    """A backend view for one optimizer step that stamps every keyed request with its seed.

    specs: the step's rollout specs in the order given to the rollout loop (`RolloutKey.spec`
    indexes them); a spec's place is its prompt group and its rank among that group's specs."""

    def __init__(self, backend: GenerationBackend, *, seed: int, step: int, specs: Sequence[RolloutSpec]) -> None:
        self.backend = backend
        self.continuous_batching = bool(getattr(backend, "continuous_batching", False))
        self.base = (seed, step)
        seen: Counter[int] = Counter()
        self.places: list[tuple[int, int]] = []
        for s in specs:
            self.places.append((s.group, seen[s.group]))
            seen[s.group] += 1

    def seed_for(self, req: GenRequest) -> int | None:
        if req.key is None or not 0 <= req.key.spec < len(self.places):
            return req.seed
        return derive_seed(*self.base, *self.places[req.key.spec], req.key.attempt, req.turn)

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return await self.backend.generate([replace(r, seed=self.seed_for(r)) for r in requests])

    def sync_weights(self, model) -> None:
        self.backend.sync_weights(model)

    def release_memory(self) -> None:
        self.backend.release_memory()
