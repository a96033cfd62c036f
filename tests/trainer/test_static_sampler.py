"""transformers.sampler: static on CPU (eager; on CUDA the same code runs compiled, test_gpu.py):
the logprob of every sampled token is the one the training model recomputes, stops are on ids,
a seeded row samples the same alone or in any batch, and the counter-hash Gumbel-max choice
draws from the softmax it reports."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tito.rollout.generation import FinishReason, GenRequest
from trainer.backends.hf import TransformersBackend
from trainer.backends.scripted import teacher_forced_logprobs
from trainer.backends.static_sampler import choose_tokens, row_keys
from trainer.model import build_tiny_qwen3


@pytest.fixture(scope="module")
def model():
    return build_tiny_qwen3(vocab_size=512, seed=1).eval()


def backend(model, **kw) -> TransformersBackend:
    return TransformersBackend(model, sampler="static", max_len=48, max_batch_size=4, compile=False, **kw)


def test_logprobs_match_recompute_and_stops_are_ids(model):
    reqs = [GenRequest(prompt_ids=[5, 9, 11, 300, 2, 7, 8], max_new=12, stop_token_ids=(3,), temperature=1.0, seed=1),
            GenRequest(prompt_ids=[42], max_new=5, stop_token_ids=(3, 4), temperature=0.7, seed=2),
            GenRequest(prompt_ids=[1, 2, 3, 4], max_new=9, stop_token_ids=(), temperature=1.3),
            GenRequest(prompt_ids=[6, 6], max_new=7, stop_token_ids=(), temperature=0.0, seed=4),
            GenRequest(prompt_ids=[8] * 30, max_new=16, stop_token_ids=(3,), temperature=1.0, seed=5)]  # a 2nd group
    results = asyncio.run(backend(model).generate(reqs))
    for req, res in zip(reqs, results):
        assert len(res.ids) == len(res.logprobs) >= 1 and len(res.ids) <= req.max_new
        if res.finish_reason is FinishReason.STOP:
            assert res.ids[-1] in req.stop_token_ids and not set(res.ids[:-1]) & set(req.stop_token_ids)
        else:
            assert len(res.ids) == req.max_new
        ref = teacher_forced_logprobs(model, req.prompt_ids, res.ids, req.temperature)
        assert res.logprobs == pytest.approx(ref, abs=2e-4)
    greedy = teacher_forced_logprobs(model, reqs[3].prompt_ids, results[3].ids, 0.0)
    assert results[3].logprobs == pytest.approx(greedy, abs=2e-4)
    # A stop id at the first greedy token ends the turn there.
    stop = results[3].ids[0]
    (cut,) = asyncio.run(backend(model).generate([GenRequest([6, 6], 7, (stop,), temperature=0.0)]))
    assert cut.ids == [stop] and cut.finish_reason is FinishReason.STOP


def test_a_seeded_row_samples_the_same_alone_or_in_a_batch(model):
    target = GenRequest(prompt_ids=[10, 11, 12], max_new=10, stop_token_ids=(), temperature=1.0, seed=77)
    others = [GenRequest(prompt_ids=list(range(20, 20 + n)), max_new=6, stop_token_ids=(), seed=n) for n in (1, 9, 4)]
    (alone,) = asyncio.run(backend(model).generate([target]))
    mixed = asyncio.run(backend(model).generate([others[0], target, *others[1:]]))
    assert mixed[1].ids == alone.ids and mixed[1].logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    other_seed = asyncio.run(backend(model).generate([GenRequest(target.prompt_ids, 10, (), seed=78)]))[0]
    assert other_seed.ids != alone.ids


def test_unseeded_rows_draw_from_the_backend_generator(model):
    req = GenRequest(prompt_ids=[1, 2], max_new=8, stop_token_ids=(), temperature=1.0)
    a = asyncio.run(backend(model, seed=3).generate([req]))[0]
    b = asyncio.run(backend(model, seed=3).generate([req]))[0]
    c = asyncio.run(backend(model, seed=4).generate([req]))[0]
    assert a.ids == b.ids and a.ids != c.ids


def test_gumbel_choice_draws_from_the_reported_distribution():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, -3.0]).repeat(40_000, 1)
    temps = torch.full((40_000,), 0.8)
    keys = row_keys(list(range(40_000)), "cpu")
    tokens, logp = choose_tokens(logits, temps, keys, torch.tensor(5))
    probs = torch.softmax(logits[0] / 0.8, -1)
    freq = torch.bincount(tokens, minlength=6).float() / 40_000
    assert (freq - probs).abs().max() < 0.01, (freq, probs)  # 4 sigma at p=0.5 is 0.01
    assert torch.allclose(logp, torch.log(probs)[tokens], atol=1e-6)
    again, _ = choose_tokens(logits, temps, keys, torch.tensor(6))  # another step: other draws
    assert (again != tokens).float().mean() > 0.3


def test_what_does_not_fit_the_cache_is_refused(model):
    with pytest.raises(ValueError, match="exceeds the static cache's 48 positions"):
        backend(model).generate_sync([GenRequest(prompt_ids=[1] * 40, max_new=9, stop_token_ids=())])
    with pytest.raises(ValueError, match="unknown sampler"):
        TransformersBackend(model, sampler="fast")
