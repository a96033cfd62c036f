"""Per-request sampling seeds: a rollout's samples depend on its place in the run, not on batching
or on the rank that generated it."""

from __future__ import annotations

import asyncio

import pytest

from tito.rollout.generation import GenRequest, RolloutKey
from trainer.backends.hf import TransformersBackend
from trainer.backends.seeding import StepSeeds, derive_seed
from trainer.model import build_tiny_qwen3
from trainer.rollout import RolloutSpec


class Recorder:
    def __init__(self) -> None:
        self.seen: list[GenRequest] = []

    async def generate(self, requests):
        self.seen.extend(requests)
        return []


def test_derive_seed_is_stable_and_63_bit():
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2) != derive_seed(0, 1, 3)
    assert 0 <= derive_seed(2**40, 7) < 2**63
    assert derive_seed(1, 2, 3) == 733464669408481064  # fixed across processes and versions


def test_seed_depends_on_place_in_the_global_batch_not_on_the_rank():
    groups = [RolloutSpec(group=g, prompt_ids=[1]) for g in range(4) for _ in range(2)]
    single = StepSeeds(Recorder(), seed=0, step=3, specs=groups)
    rank1 = StepSeeds(Recorder(), seed=0, step=3, specs=[s for s in groups if s.group % 2 == 1])

    def seed(view, spec, attempt=0, turn=0):
        return view.seed_for(GenRequest([1], 4, (2,), key=RolloutKey(spec, attempt), turn=turn))

    # group 3's second member: index 7 in one process, index 3 on rank 1 of two
    assert seed(single, 7) == seed(rank1, 3)
    assert len({seed(single, i) for i in range(8)}) == 8  # members of a group differ
    assert seed(single, 0) != seed(single, 0, attempt=1) != seed(single, 0, turn=1)
    assert seed(single, 0) != seed(StepSeeds(Recorder(), seed=0, step=4, specs=groups), 0)
    unkeyed = GenRequest([1], 4, (2,), seed=9)
    assert single.seed_for(unkeyed) == 9
    rec = Recorder()
    asyncio.run(StepSeeds(rec, seed=0, step=3, specs=groups).generate([GenRequest([1], 4, (2,), key=RolloutKey(7))]))
    assert rec.seen[0].seed == seed(single, 7)


@pytest.fixture(scope="module")
def model():
    return build_tiny_qwen3(vocab_size=256, seed=2).eval()


def test_seeded_request_samples_the_same_alone_or_in_any_batch(model):
    backend = TransformersBackend(model, seed=0)
    mine = GenRequest([5, 6, 7, 8], 12, (), temperature=1.0, seed=1234)
    others = [GenRequest([9] * n, 12, (), temperature=1.0, seed=n) for n in (1, 6, 9)]
    alone = asyncio.run(backend.generate([mine]))[0]
    batched = asyncio.run(backend.generate([others[0], mine, *others[1:]]))[1]
    reordered = asyncio.run(TransformersBackend(model, seed=99).generate([*others[::-1], mine]))[-1]
    assert alone.ids == batched.ids == reordered.ids
    assert batched.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    other_seed = asyncio.run(backend.generate([GenRequest([5, 6, 7, 8], 12, (), seed=1235)]))[0]
    assert other_seed.ids != alone.ids
