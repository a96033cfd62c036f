"""TitoRollout's vLLM paths (colocate and server), with a real GRPOTrainer, a real env server and a
small fake of TRL's vLLM objects (tests/trl/fake_vllm.py; vLLM cannot be installed here).

The fake answers from the example's steering script, so rollouts make a real tool call through
tito. What is tested is the seam: the sampling parameters TitoRollout asks for (per-turn cap,
tito's stop ids, logprobs=0, TRL's sampling settings), one engine call per turn, the logprobs read
back and handed to TRL, and the ids TRL trains on.
"""

from __future__ import annotations

import inspect
import sys
import types

import pytest
from datasets import Dataset

from tests.trl import fake_vllm
from tests.trl.helpers import CapturingGRPOTrainer, Row, assert_logprobs, assert_token_exact, grpo_config
from tito.rollout.generation import FinishReason
from tito.trl import TitoRollout
from tito.trl.generation import cut_turn
from trainer.model import build_tiny_qwen3

STEERED = {"prompt": [{"role": "user", "content": "What is 23 * 45?"}], "answer": "1035", "code": "print(23 * 45)"}
UNSTEERED = {"prompt": [{"role": "user", "content": "What is 67 * 89?"}], "answer": "5963", "code": ""}
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "min_p": 0.05}
PER_TURN = 40


def env_args(row):
    return {"expected_answer": row["answer"]}


@pytest.fixture
def vllm_module(monkeypatch):
    """`from vllm import SamplingParams` gets the fake's (the colocate path builds its own params)."""
    module = types.ModuleType("vllm")
    module.SamplingParams = fake_vllm.SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)


def vllm_trainer(mode: str, client, tokenizer, example, tmp_path, **vg: object):
    tito = TitoRollout(client, tokenizer, "python", max_turns=3, max_tokens_per_turn=PER_TURN)
    trainer = CapturingGRPOTrainer(
        model=build_tiny_qwen3(seed=0), processing_class=tokenizer, args=grpo_config(tmp_path, **SAMPLING),
        train_dataset=tito.attach(Dataset.from_list([STEERED, UNSTEERED]), env_args=env_args),
        rollout_func=tito.rollout_func, reward_funcs=tito.reward_func)
    script = fake_vllm.Script(example.steering_bias(tokenizer, [STEERED]), filler=tokenizer.encode(" la")[0])
    engine = {"llm": fake_vllm.FakeLLM(script)} if mode == "colocate" else {
        "vllm_client": fake_vllm.FakeVLLMClient(script)}
    # What GRPOConfig(use_vllm=True, vllm_mode=mode) would have set up, with the fake as the engine.
    trainer.use_vllm, trainer.vllm_mode, trainer._last_loaded_step = True, mode, -1
    trainer.vllm_generation = fake_vllm.FakeVLLMGeneration(mode=mode, accelerator=trainer.accelerator,
                                                           **SAMPLING, **engine, **vg)
    return tito, trainer


@pytest.mark.docker
@pytest.mark.slow
def test_colocate_through_a_grpo_step(vllm_module, client, tokenizer, example, tmp_path):
    tito, trainer = vllm_trainer("colocate", client, tokenizer, example, tmp_path)
    trainer.train()
    rows = trainer.captured
    assert sorted(r.extras["tito_status"] for r in rows) == ["completed"] * 2 + ["truncated:length"] * 2
    for r in rows:
        assert_token_exact(client, r)
    llm = trainer.vllm_generation.llm
    assert [len(c) for c in llm.calls] == [4, 2]  # one engine call per turn, all active rollouts in it
    for params in llm.calls:
        for p in params:
            assert p.kwargs["stop_token_ids"] == list(tito.stop_token_ids) and p.kwargs["ignore_eos"]
            assert p.kwargs["n"] == 1 and p.kwargs["logprobs"] == 0 and p.kwargs["detokenize"] is False
            assert {k: p.kwargs[k] for k in SAMPLING} == SAMPLING
    assert all(p.max_tokens == PER_TURN for p in llm.calls[0])
    assert trainer.vllm_generation.weight_syncs == 1  # TRL's own sync before rollout_func
    # TRL used the sampler logprobs for its importance-sampling correction.
    assert any("sampling/importance_sampling_ratio/mean" in h for h in trainer.state.log_history)


@pytest.mark.docker
@pytest.mark.slow
def test_server_mode_one_call_per_turn(client, tokenizer, example, tmp_path):
    tito, trainer = vllm_trainer("server", client, tokenizer, example, tmp_path)
    prompts = [r["prompt"] for r in tito.attach([STEERED, STEERED, UNSTEERED], env_args=env_args)]
    out = tito.rollout_func(prompts, trainer)
    assert out["tito_status"] == ["completed", "completed", "truncated:length"]
    for i in range(3):
        assert_token_exact(client, Row(out["prompt_ids"][i], out["completion_ids"][i], out["env_mask"][i],
                                       {k: v[i] for k, v in out.items() if k.startswith("tito_")}))
        assert_logprobs(out, i)
    calls = trainer.vllm_generation.vllm_client.calls
    assert [len(c["prompts"]) for c in calls] == [3, 2]
    for c in calls:
        assert c["n"] == 1 and c["logprobs"] == 0 and c["max_tokens"] <= PER_TURN
        assert c["generation_kwargs"]["stop_token_ids"] == list(tito.stop_token_ids)
        assert {k: c[k] for k in SAMPLING} == SAMPLING


@pytest.mark.docker
def test_colocate_sleep_mode_wakes_and_resyncs(vllm_module, client, tokenizer, example, tmp_path):
    tito, trainer = vllm_trainer("colocate", client, tokenizer, example, tmp_path, enable_sleep_mode=True)
    trainer.vllm_generation._llm_weights_sleeping = True
    prompts = [r["prompt"] for r in tito.attach([STEERED], env_args=env_args)]
    assert tito.rollout_func(prompts, trainer)["tito_status"] == ["completed"]
    assert trainer.vllm_generation.weight_syncs == 1
    assert trainer.vllm_generation.llm.sleeps == ["wake_up['kv_cache']", "sleep2"]


def test_the_fakes_have_trl_s_signatures():
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    assert list(inspect.signature(fake_vllm.FakeVLLMClient.generate).parameters) == \
        list(inspect.signature(VLLMClient.generate).parameters)
    real = set(inspect.signature(VLLMGeneration.__init__).parameters) | {"mode", "llm", "vllm_client"}
    assert {f for f in fake_vllm.FakeVLLMGeneration.__dataclass_fields__} - real == {"weight_syncs"}


def test_a_turn_ends_at_its_first_stop_or_its_cap():
    stops = (7, 8)
    assert cut_turn([1, 2, 7, 8, 0], [-1.0] * 5, 10, stops) == cut_turn([1, 2, 7], [-1.0] * 3, 10, stops)
    r = cut_turn([1, 2, 7], [-0.5, -0.25, -0.125], 10, stops)
    assert (r.ids, r.logprobs, r.finish_reason) == ([1, 2, 7], [-0.5, -0.25, -0.125], FinishReason.STOP)
    r = cut_turn([1, 2, 3, 7], [-1.0] * 4, 2, stops)  # a batch-wide cap larger than this request's
    assert (r.ids, r.finish_reason) == ([1, 2], FinishReason.LENGTH)
    assert cut_turn([1, 7], [-1.0, None], 5, stops).logprobs is None  # a missing logprob aborts the rollout
