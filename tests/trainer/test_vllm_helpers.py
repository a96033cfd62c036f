"""The vLLM helpers' plain functions, without an engine (objects shaped like vLLM's outputs).

Outputs the real engine never returns (a logprob list one short, a position without the sampled
token) are only reachable here; the real engine's own shapes are in test_vllm_backend.py."""

from dataclasses import dataclass

import pytest
import torch

from tito.rollout.generation import FinishReason, GenRequest
from tito.rollout.vllm import (extract_logprobs, extract_result, launcher_env, sampling_params_kwargs, token_prompt,
                               vllm_weight_name, weights_for_vllm)


@dataclass
class Logprob:  # shaped like vllm.sequence.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:  # shaped like vllm.outputs.CompletionOutput
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    stop_reason: int | str | None = None


REQ = GenRequest(prompt_ids=[1, 2, 3], max_new=4, stop_token_ids=(151645, 151643), temperature=0.7)


def test_sampling_params_stop_on_ids_only():
    kw = sampling_params_kwargs(REQ)
    assert kw["max_tokens"] == 4
    assert kw["stop_token_ids"] == [151645, 151643]
    assert kw["ignore_eos"] is True and "stop" not in kw  # no stop strings, no implicit EOS
    assert kw["logprobs"] == 0 and kw["temperature"] == 0.7
    assert kw["detokenize"] is False
    # Only a request's own seed: one shared seed would give a GRPO group identical completions.
    assert "seed" not in kw
    assert sampling_params_kwargs(GenRequest([1], 3, (2,), seed=11))["seed"] == 11
    with pytest.raises(ValueError):
        sampling_params_kwargs(GenRequest([1], 0, (2,)))
    with pytest.raises(ValueError):
        sampling_params_kwargs(GenRequest([1], 3, ()))


def test_launcher_env_fills_only_what_the_launcher_left_out():
    single = launcher_env({}, free_port=4242)
    assert single == {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                      "MASTER_PORT": "4242", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    torchrun = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
    assert launcher_env(torchrun, free_port=1) == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def test_token_prompt():
    assert token_prompt(REQ) == {"prompt_token_ids": [1, 2, 3]}
    with pytest.raises(ValueError):
        token_prompt(GenRequest([], 3, (2,)))


def _lps(ids, vals):
    # vLLM returns the sampled token plus (with logprobs=0) nothing else, sometimes a top-1 too.
    return [{t: Logprob(v), 99: Logprob(-9.0)} for t, v in zip(ids, vals)]


def test_extract_stop_and_length():
    out = extract_result(CompletionOutput([5, 6, 151645], _lps([5, 6, 151645], [-1, -2, -3]), "stop",
                                          151645), REQ)
    assert out.ids == [5, 6, 151645] and out.logprobs == [-1, -2, -3]
    assert out.finish_reason is FinishReason.STOP
    out = extract_result(CompletionOutput([5, 6, 7, 8], _lps([5, 6, 7, 8], [-1] * 4), "length"), REQ)
    assert out.finish_reason is FinishReason.LENGTH
    # a stop id sampled as the very last allowed token is a stop, not a cut
    out = extract_result(CompletionOutput([5, 6, 7, 151643], _lps([5, 6, 7, 151643], [-1] * 4),
                                          "length"), REQ)
    assert out.finish_reason is FinishReason.STOP


def test_extract_refuses_bad_outputs():
    with pytest.raises(ValueError, match="not one of the stop ids"):
        extract_result(CompletionOutput([5, 6], _lps([5, 6], [-1, -1]), "stop", "</s>"), REQ)
    with pytest.raises(ValueError, match="abort"):
        extract_result(CompletionOutput([5], _lps([5], [-1]), "abort"), REQ)
    with pytest.raises(ValueError, match="max_tokens"):
        extract_result(CompletionOutput([1, 2, 3, 4, 5], None, "length"), REQ)


def test_missing_logprobs_become_none():
    assert extract_logprobs([5, 6], None) is None
    assert extract_logprobs([5, 6], [{5: Logprob(-1.0)}]) is None  # one short
    assert extract_logprobs([5, 6], [{5: Logprob(-1.0)}, {7: Logprob(-1.0)}]) is None  # wrong token
    assert extract_logprobs([5, 6], [{5: -1.0}, {6: -2.5}]) == [-1.0, -2.5]
    out = extract_result(CompletionOutput([5, 151645], None, "stop"), REQ)
    assert out.logprobs is None  # the rollout loop aborts such a rollout


def test_weight_names():
    assert vllm_weight_name("_orig_mod.model.layers.0.self_attn.q_proj.weight") == \
        "model.layers.0.self_attn.q_proj.weight"
    assert vllm_weight_name("module._orig_mod.model.norm.weight") == "model.norm.weight"
    assert vllm_weight_name("model.embed_tokens.weight") == "model.embed_tokens.weight"


def test_weights_for_vllm_sends_the_whole_state_dict_with_the_tied_head():
    from trainer.model import build_tiny_qwen3

    model = build_tiny_qwen3(vocab_size=300)
    named = list(weights_for_vllm(model.state_dict().items()))
    names = [n for n, _ in named]
    # The tied lm_head.weight too: vLLM's CPU build packs it apart from the embedding.
    assert "lm_head.weight" in names and "model.embed_tokens.weight" in names
    assert "model.layers.1.self_attn.k_proj.weight" in names and len(names) == len(set(names))
    assert all(not t.requires_grad for _, t in named)
    wrapped = [("_orig_mod." + n, t) for n, t in model.state_dict().items()]
    wrapped.append(("module._orig_mod.lm_head.weight", torch.zeros(1)))  # a second wrapper's copy: dropped
    assert [n for n, _ in weights_for_vllm(wrapped)] == names
