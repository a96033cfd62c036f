"""TitoRollout on TRL's colocated vLLM: TRL's real engine (vLLM's CPU build, patched by
`tito.trl.vllm_cpu.patch`), an unchanged GRPOTrainer and a real env server.

A random model never writes a tool call, so the engine samples with the example's steering: a
vLLM logits processor (`SequenceBias`) biases the steered prompt's rollouts into a run_python call
and the answer, through tito. The other prompt's rollouts are unbiased: their sampled logprobs are
the engine's own, and must equal the training model's recompute (fp32: within TOL, measured ~1e-6).
"""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

from tests.trl.helpers import CapturingGRPOTrainer, Row, assert_logprobs, assert_token_exact, grpo_config
from tito.trl import TitoRollout
from tito.trl.generation import cut_turn
from tito.rollout.generation import FinishReason

STEERED = {"prompt": [{"role": "user", "content": "What is 23 * 45?"}], "answer": "1035", "code": "print(23 * 45)"}
UNSTEERED = {"prompt": [{"role": "user", "content": "What is 67 * 89?"}], "answer": "5963", "code": ""}
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "min_p": 0.05}
PER_TURN = 40
TOL = 1e-4


def env_args(row):
    return {"expected_answer": row["answer"]}


@pytest.fixture(scope="module")
def colocated(client, tokenizer, example, tmp_path_factory):
    """A GRPOTrainer on TRL's colocated engine, steered as the example does, with a spy on the engine."""
    pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs its CPU build)")
    import trl.generation.vllm_generation as vllm_generation

    saved = vllm_generation.LLM  # the example wraps TRL's LLM for its logits processor
    tmp = tmp_path_factory.mktemp("trl-vllm")
    args = example.parse_args(["--env-address", "unused", "--vllm-mode", "colocate", "--steer"])
    model = example.vllm_ready_model(args, str(tmp))
    tito = TitoRollout(client, tokenizer, "python", max_turns=3, max_tokens_per_turn=PER_TURN)
    bias = example.steering_bias(tokenizer, [STEERED])
    trainer = CapturingGRPOTrainer(
        model=model, processing_class=tokenizer, train_dataset=tito.attach(Dataset.from_list([STEERED, UNSTEERED]),
                                                                           env_args=env_args),
        args=grpo_config(tmp, use_vllm=True, vllm_mode="colocate", vllm_max_model_length=640,
                         generation_kwargs={"extra_args": {"sequence_bias": bias}}, **SAMPLING),
        rollout_func=tito.rollout_func, reward_funcs=tito.reward_func)
    vllm_generation.LLM = saved
    llm = trainer.vllm_generation.llm
    llm.calls = []
    generate = llm.generate

    def spy(prompts, sampling_params=None, **kw):
        llm.calls.append(sampling_params)
        return generate(prompts, sampling_params=sampling_params, **kw)

    llm.generate = spy
    return tito, trainer


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.vllm
def test_colocate_through_a_grpo_step(colocated, client):
    tito, trainer = colocated
    trainer.train()
    rows = trainer.captured
    assert sorted(r.extras["tito_status"] for r in rows) == ["completed"] * 2 + ["truncated:length"] * 2
    for r in rows:
        assert_token_exact(client, r)  # the engine's ids and tito's suffix ids, verbatim, as TRL trains on them
    assert all(r.extras["tito_reward"] == 1.0 for r in rows if r.extras["tito_status"] == "completed")
    calls = trainer.vllm_generation.llm.calls
    assert [len(c) for c in calls] == [4, 2]  # one engine call per turn, all active rollouts in it
    for params in calls:
        for p in params:
            assert list(p.stop_token_ids) == list(tito.stop_token_ids) and p.ignore_eos
            assert p.n == 1 and p.logprobs == 0 and p.detokenize is False
            assert {k: getattr(p, k) for k in SAMPLING} == pytest.approx(SAMPLING)
    assert all(p.max_tokens == PER_TURN for p in calls[0])
    # TRL used the sampler logprobs for its importance-sampling correction.
    assert any("sampling/importance_sampling_ratio/mean" in h for h in trainer.state.log_history)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.vllm
def test_after_the_step_the_engine_samples_the_trained_policy(colocated, client):
    """TRL's sync (tito's push on the CPU build) puts the trained weights into the engine: the
    unsteered rollouts' sampled logprobs equal the training model's recompute. (Plain temperature
    sampling here: top-k/p and min-p renormalize over the tokens they keep.)"""
    tito, trainer = colocated
    vg = trainer.vllm_generation
    filters = vg.top_p, vg.top_k, vg.min_p
    vg.top_p, vg.top_k, vg.min_p = 1.0, 0, 0.0
    try:
        vg.sync_weights()
        prompts = [r["prompt"] for r in tito.attach([UNSTEERED, UNSTEERED, STEERED], env_args=env_args)]
        out = tito.rollout_func(prompts, trainer)
    finally:
        vg.top_p, vg.top_k, vg.min_p = filters
    assert out["tito_status"][2] == "completed"
    for i in range(3):
        assert_token_exact(client, Row(out["prompt_ids"][i], out["completion_ids"][i], out["env_mask"][i],
                                       {k: v[i] for k, v in out.items() if k.startswith("tito_")}))
        assert_logprobs(out, i)
    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    for i in range(2):  # unsteered: the engine's own distribution at temperature 0.7
        prompt, completion = out["prompt_ids"][i], out["completion_ids"][i]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].float()
        recomputed = torch.log_softmax(logits / SAMPLING["temperature"], -1).gather(
            -1, torch.tensor(completion)[:, None]).squeeze(-1)
        assert (torch.tensor(out["logprobs"][i]) - recomputed).abs().max().item() < TOL


def test_sleep_mode_is_refused_on_the_cpu_build():
    pytest.importorskip("vllm")
    import trl.generation.vllm_generation as vllm_generation

    from tito.rollout.vllm import on_cpu_platform
    from tito.trl import vllm_cpu

    if not on_cpu_platform():
        pytest.skip("vLLM's GPU build: TRL's sleep mode is TRL's own")
    saved = vllm_generation.LLM
    try:
        assert vllm_cpu.patch()
        with pytest.raises(ValueError, match="no sleep mode.*vllm_enable_sleep_mode=False"):
            vllm_generation.LLM(model="unused", enable_sleep_mode=True, max_model_len=256)
        with pytest.raises(ValueError, match="vllm_max_model_length"):
            vllm_generation.LLM(model="unused", max_model_len=None)
    finally:
        vllm_generation.LLM = saved


def test_a_turn_ends_at_its_first_stop_or_its_cap():
    stops = (7, 8)
    assert cut_turn([1, 2, 7, 8, 0], [-1.0] * 5, 10, stops) == cut_turn([1, 2, 7], [-1.0] * 3, 10, stops)
    r = cut_turn([1, 2, 7], [-0.5, -0.25, -0.125], 10, stops)
    assert (r.ids, r.logprobs, r.finish_reason) == ([1, 2, 7], [-0.5, -0.25, -0.125], FinishReason.STOP)
    r = cut_turn([1, 2, 3, 7], [-1.0] * 4, 2, stops)  # a batch-wide cap larger than this request's
    assert (r.ids, r.finish_reason) == ([1, 2], FinishReason.LENGTH)
    assert cut_turn([1, 7], [-1.0, None], 5, stops).logprobs is None  # a missing logprob aborts the rollout
