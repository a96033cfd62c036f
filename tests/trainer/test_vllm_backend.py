"""The colocated vLLM backend against a fake vLLM with the real signatures (tests/trainer/fake_vllm.py).

The fake engine samples from its own copy of the model, loaded from the folder the backend wrote,
so the rollouts' logprobs match the training model only while the weights are really synced.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest
import torch

from tests.inprocess_env import InProcessEnv
from tests.trainer import fake_vllm
from tito.rollout.generation import FinishReason, GenRequest
from tito.types import OpenedSession, StepResult, StepStatus
from trainer.backends.seeding import StepSeeds
from trainer.backends.vllm_backend import VllmBackend, engine_model
from trainer.config import load_config
from trainer.model import build_tiny_qwen3, collate, target_logprobs
from trainer.rollout import RolloutLimits, RolloutSpec, run_rollouts
from trainer.setup import Run
from trainer.tasks import TokenSubsetTask
from trainer.train import train

VOCAB = 512
STOPS = tuple(range(0, VOCAB, 2))  # half the vocabulary: a random model ends its turns quickly


@pytest.fixture
def vllm(monkeypatch):
    saved = dict(os.environ)
    yield fake_vllm.install(monkeypatch)
    os.environ.clear()  # the backend sets the launcher's variables for a single process
    os.environ.update(saved)


@pytest.fixture
def model():
    return build_tiny_qwen3(vocab_size=VOCAB, seed=3)


def make_backend(model, *overrides: str) -> VllmBackend:
    cfg = load_config(None, ["backend=vllm", "budget.context=64", *overrides])
    return VllmBackend.from_training_model(model, cfg, seed=5)


class ToolEnv(InProcessEnv):
    """Every stopped turn runs a 'tool' (6 suffix ids) until the third, which ends the episode."""

    def __init__(self) -> None:
        self.closed = []

    async def open(self, request):
        return OpenedSession(f"s{json.loads(request.env_args_json)['i']}", tuple(range(10, 20)), tools=())

    async def step(self, request):
        if request.seq == 3:
            return StepResult(seq=request.seq, status=StepStatus.EPISODE_END, reward=1.0)
        return StepResult(seq=request.seq, status=StepStatus.OK, suffix_ids=tuple(range(300, 306)))

    async def close_session(self, session_id):
        self.closed.append(session_id)
        return True


def rollouts_through(backend, n=4, limits=RolloutLimits(budget=40, per_turn_cap=8, reserve=0, max_turns=4)):
    specs = [RolloutSpec(group=0, env_args={"i": i}) for i in range(n)]
    seeded = StepSeeds(backend, seed=0, step=1, specs=specs)
    return asyncio.run(run_rollouts(specs, seeded, ToolEnv(), "python", "", limits, list(STOPS), gen_batch_wait_s=0.01))


def assert_logprobs_match(model, rollouts):
    batch = collate(rollouts, torch.zeros(len(rollouts)), pad_id=0, device="cpu")
    with torch.no_grad():
        lp = target_logprobs(model, batch.input_ids, batch.mask)
    sel = batch.mask.bool()
    assert (lp[sel] - batch.old_logp[sel]).abs().max().item() < 1e-4


def test_engine_is_colocated_in_this_process(vllm, model):
    backend = make_backend(model, "vllm.gpu_memory_utilization=0.4", "vllm.max_num_seqs=32")
    llm = fake_vllm.LLM.created[-1]
    kw = llm.kwargs
    assert kw["distributed_executor_backend"] == "external_launcher"
    assert kw["skip_tokenizer_init"] is True and kw["logprobs_mode"] == "processed_logprobs"
    assert kw["max_model_len"] == 64 and kw["gpu_memory_utilization"] == 0.4 and kw["max_num_seqs"] == 32
    assert kw["enable_sleep_mode"] is False and kw["seed"] == 5
    # A single process is rank 0 of 1, with a rendezvous address of its own.
    assert llm.launch_env["RANK"] == "0" and llm.launch_env["WORLD_SIZE"] == "1"
    assert engine_model(llm) is llm.engine_model and backend.tied_embeddings


def test_multi_turn_requests_and_logprobs(vllm, model):
    """Per turn: max_tokens = min(per_turn, budget - ids so far), stop on our ids only, the sampled
    token's logprob for every generated token (matching the training model), one seed per request."""
    backend = make_backend(model)
    rollouts, stats = rollouts_through(backend)
    llm = fake_vllm.LLM.created[-1]
    assert stats.aborted_attempts == 0 and len(rollouts) == 4
    assert max(len(r.turns) for r in rollouts) >= 2  # the tool suffixes made later turns shorter
    for prompt, p in zip(llm.prompts, llm.params):
        assert p.max_tokens == min(8, 40 - len(prompt))
        assert p.stop_token_ids == list(STOPS) and p.ignore_eos and not p.stop
        assert p.logprobs == 0 and p.detokenize is False and p.n == 1
    first_turns = [p.seed for prompt, p in zip(llm.prompts, llm.params) if len(prompt) == 10]
    assert len(set(first_turns)) == 4  # the group's members do not share a seed
    for r in rollouts:
        assert all(lp == lp for lp, m in zip(r.logprobs, r.mask) if m == 1)
    assert_logprobs_match(model, rollouts)


def test_missing_logprobs_abort_the_rollout(vllm, model):
    backend = make_backend(model)
    fake_vllm.LLM.created[-1].drop_logprobs = True
    rollouts, stats = rollouts_through(backend, n=2)
    assert rollouts == [] and stats.dropped == 2
    assert all("logprobs" in reason for reason in stats.abort_reasons)


def test_finish_reasons(vllm, model):
    backend = make_backend(model)
    greedy = asyncio.run(backend.generate([GenRequest([7, 8, 9], 4, (VOCAB - 1,), temperature=0.0)]))[0]
    assert VOCAB - 1 not in greedy.ids and greedy.finish_reason is FinishReason.LENGTH and len(greedy.ids) == 4
    first = greedy.ids[0]
    stopped = asyncio.run(backend.generate([GenRequest([7, 8, 9], 4, (first,), temperature=0.0)]))[0]
    assert stopped.ids == [first] and stopped.finish_reason is FinishReason.STOP
    at_cap = asyncio.run(backend.generate([GenRequest([7, 8, 9], 2, (greedy.ids[1],), temperature=0.0)]))[0]
    assert at_cap.finish_reason is FinishReason.STOP  # a stop id as the last allowed token is a stop


def test_sync_weights_then_prefix_cache_reset(vllm, model):
    backend = make_backend(model)
    llm = fake_vllm.LLM.created[-1]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    backend.sync_weights(model)
    engine = dict(llm.engine_model.hf.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(engine[name], p), name
    assert "lm_head.weight" not in llm.engine_model.loads[-1]  # tied: vLLM ties it itself
    assert llm.events[-2:] == [("load_weights",), ("reset_prefix_cache",)]
    rollouts, _ = rollouts_through(backend, n=2)
    assert_logprobs_match(model, rollouts)  # sampled from the new weights


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_while_training_wake_in_sync(vllm, model, level):
    backend = make_backend(model, f"vllm.sleep_level={level}")
    llm = fake_vllm.LLM.created[-1]
    assert llm.kwargs["enable_sleep_mode"] is True
    backend.release_memory()
    assert llm.asleep and llm.events[-2:] == [("reset_prefix_cache",), ("sleep", level)]
    backend.release_memory()  # already asleep: nothing
    assert llm.events[-1] == ("sleep", level)
    backend.sync_weights(model)
    assert llm.events[-4:] == [("wake_up", ("weights",)), ("load_weights",), ("wake_up", ("kv_cache",)),
                               ("reset_prefix_cache",)]
    assert not llm.asleep
    rollouts, _ = rollouts_through(backend, n=2)
    assert_logprobs_match(model, rollouts)
    # Asleep at the next generation (a step that trained on nothing): it wakes with the weights.
    backend.release_memory()
    rollouts, stats = rollouts_through(backend, n=2)
    assert stats.aborted_attempts == 0
    assert_logprobs_match(model, rollouts)


def test_training_loop_syncs_every_step(vllm, model, tmp_path):
    """train() with the vLLM backend: it sleeps before the loss, wakes and syncs after the step, so
    the next step samples from the updated policy (ratio 1 between sampler and recompute)."""
    cfg = load_config(None, [
        "backend=vllm", "vllm.sleep_level=2", "task.name=token_subset", "budget.context=24",
        "budget.per_turn=8", "budget.reserve=0", "budget.max_turns=1", "num_generations=4",
        "prompts_per_step=2", "steps=2", "learning_rate=0.05", "progress=false", "save_checkpoint=false",
        f"output_dir={tmp_path}"])
    backend = VllmBackend.from_training_model(model, cfg, seed=0)
    llm = fake_vllm.LLM.created[-1]
    task = TokenSubsetTask(vocab_size=VOCAB, seed=0, prompt_len=8)
    run = Run(model=model, backend=backend, task=task, env=None, stop_token_ids=[VOCAB - 1], pad_id=0)
    history = asyncio.run(train(run, cfg))
    assert [m["rollouts"] for m in history] == [8, 8]
    for m in history:
        assert abs(m["ratio_mean"] - 1) < 1e-4 and m["clip_frac"] == 0
    kinds = [e[0] for e in llm.events]
    assert kinds.count("sleep") == 2 and kinds.count("load_weights") == 2
    assert kinds[-4:] == ["wake_up", "load_weights", "wake_up", "reset_prefix_cache"]


def test_missing_vllm_says_what_to_install(monkeypatch, capsys, tmp_path):
    from trainer.__main__ import main

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    rc = main(["--set", "backend=vllm", "--set", "task.name=token_subset", "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 1 and "pip install 'tito[vllm]'" in err and "backend: transformers" in err
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before anything was loaded
