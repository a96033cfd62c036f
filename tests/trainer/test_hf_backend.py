"""transformers backend: batched, left-padded sampling with exact sampled-token logprobs."""

import asyncio

import pytest
import torch

from tito.rollout.generation import FinishReason, GenRequest
from tito.rollout.state import Rollout
from trainer.backends.hf import TransformersBackend, sample_tokens
from trainer.backends.scripted import teacher_forced_logprobs
from trainer.model import build_tiny_qwen3, collate, target_logprobs


@pytest.fixture(scope="module")
def model():
    return build_tiny_qwen3(vocab_size=512, seed=1).eval()


def test_batched_logprobs_match_recompute(model):
    """Each row of a mixed-length batch gets the same logprobs a lone teacher-forced pass gives,
    i.e. left padding and the KV cache do not change the distribution sampled from."""
    backend = TransformersBackend(model, seed=0, pad_token_id=0)
    reqs = [
        GenRequest(prompt_ids=[5, 9, 11, 300, 2, 7, 8], max_new=12, stop_token_ids=(3,), temperature=1.0),
        GenRequest(prompt_ids=[42], max_new=5, stop_token_ids=(3, 4), temperature=0.7),
        GenRequest(prompt_ids=[1, 2, 3, 4], max_new=9, stop_token_ids=(), temperature=1.3),
    ]
    results = asyncio.run(backend.generate(reqs))
    for req, res in zip(reqs, results):
        assert len(res.ids) == len(res.logprobs) >= 1
        assert len(res.ids) <= req.max_new
        if res.finish_reason is FinishReason.STOP:
            assert res.ids[-1] in req.stop_token_ids
            assert not any(t in req.stop_token_ids for t in res.ids[:-1])
        else:
            assert len(res.ids) == req.max_new
        ref = teacher_forced_logprobs(model, req.prompt_ids, res.ids, req.temperature)
        assert res.logprobs == pytest.approx(ref, abs=2e-4)


def test_stop_token_ends_turn_and_seeded_reproducible(model):
    # Greedy decoding tells us the first token; declaring it a stop id must end the turn there.
    backend = TransformersBackend(model, seed=0)
    probe = asyncio.run(backend.generate([GenRequest([5, 6], 1, (), temperature=0.0)]))[0]
    stop = probe.ids[0]
    res = asyncio.run(backend.generate([GenRequest([5, 6], 10, (stop,), temperature=0.0)]))[0]
    assert res.ids == [stop] and res.finish_reason is FinishReason.STOP
    a = asyncio.run(TransformersBackend(model, seed=7).generate([GenRequest([1, 2], 8, (), 1.0)]))
    b = asyncio.run(TransformersBackend(model, seed=7).generate([GenRequest([1, 2], 8, (), 1.0)]))
    assert a[0].ids == b[0].ids


def test_sample_tokens_logprob_is_of_sampling_distribution():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.1, 3.0]])
    temps = torch.tensor([0.5, 0.0])
    tok, lp = sample_tokens(logits, temps, torch.Generator().manual_seed(0))
    assert lp[0].item() == pytest.approx(torch.log_softmax(logits[0] / 0.5, -1)[tok[0]].item(), abs=1e-6)
    assert tok[1].item() == 2  # greedy
    assert lp[1].item() == pytest.approx(torch.log_softmax(logits[1], -1)[2].item(), abs=1e-6)


def test_training_recompute_matches_sampler(model):
    """The loss's recomputed logprobs at mask-1 positions equal the sampler's (ratio == 1)."""
    backend = TransformersBackend(model, seed=3)
    prompt = [10, 20, 30]
    res = asyncio.run(backend.generate([GenRequest(prompt, 6, (), temperature=0.9)]))[0]
    r = Rollout(budget=64)
    r.start(prompt)
    r.append_generated(res.ids, res.logprobs, res.finish_reason, 6)
    r.append_env([7, 8, 9])
    r.append_generated([11, 12], [-1.0, -1.0], FinishReason.STOP, 5)
    batch = collate([r], torch.zeros(1), pad_id=0, device="cpu")
    with torch.no_grad():
        lp = target_logprobs(model, batch.input_ids, batch.mask, temperature=0.9, chunk=2)
    n = len(res.ids)
    got = lp[0, len(prompt) - 1 : len(prompt) - 1 + n]
    assert got.tolist() == pytest.approx(res.logprobs, abs=2e-4)
    assert batch.mask[0].tolist() == r.mask[1:]
    assert (lp[0][batch.mask[0] == 0] == 0).all()


def test_sample_tokens_draws_the_distribution():
    """Frequencies over many draws match softmax(logits / T) (chi-square, fixed seed); a token of
    probability zero is never drawn, in either generator form."""
    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.25, 0.05, 0.0])
    logits = torch.log(probs).repeat(4000, 1)  # -inf where the probability is 0
    temps = torch.ones(4000)
    counts = torch.zeros(len(probs))
    for seed in range(5):
        tok, lp = sample_tokens(logits, temps, torch.Generator().manual_seed(seed))
        counts += torch.bincount(tok, minlength=len(probs))
        assert torch.allclose(lp, torch.log(probs)[tok])
    rows = [torch.Generator().manual_seed(1000 + i) for i in range(64)]
    tok, _ = sample_tokens(logits[:64], temps[:64], rows)
    assert set(tok.tolist()) <= {1, 3, 4, 5}
    assert counts[probs == 0].sum() == 0
    n = counts.sum()
    expected = probs[probs > 0] * n
    chi2 = float(((counts[probs > 0] - expected) ** 2 / expected).sum())
    assert chi2 < 16.27, (counts, chi2)  # 3 degrees of freedom, p = 0.001
    # tempered: T = 2 flattens the distribution towards uniform over the support
    tok, lp = sample_tokens(logits, torch.full((4000,), 2.0), torch.Generator().manual_seed(9))
    flat = torch.softmax(torch.log(probs) / 2.0, -1)
    assert torch.allclose(lp, torch.log(flat)[tok], atol=1e-6)
    freq = torch.bincount(tok, minlength=len(probs)).float() / 4000
    assert torch.allclose(freq, flat, atol=0.03)
