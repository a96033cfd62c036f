"""The colocated vLLM backend against the real engine: vLLM's CPU build, in this process.

One engine for the module (its start costs seconds), fp32, built from the tiny Qwen3 with
head_dim 32 (vLLM's CPU attention refuses the default 16) and the real Qwen vocabulary, since the
env server renders real ids. The module's training model is shared too: a test that depends on
the engine holding its weights pushes them first.

Tolerance: the engine's sampled logprobs and the training model's recompute agree within TOL in
fp32 (measured ~1e-6: the same math in another kernel order).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest
import torch

from tests.inprocess_env import InProcessEnv
from tito.client import AsyncTitoClient, RecordingClient
from tito.rollout.generation import FinishReason, GenRequest, GenResult
from tito.rollout.state import Status, TruncationCause
from tito.types import OpenedSession, StepResult, StepStatus
from trainer.backends.scripted import teacher_forced_logprobs
from trainer.backends.seeding import StepSeeds
from trainer.backends.vllm_backend import VllmBackend, engine_model
from trainer.config import ConfigError, load_config
from trainer.model import build_tiny_qwen3, collate, target_logprobs
from trainer.rollout import RolloutLimits, RolloutSpec, run_rollouts

pytestmark = pytest.mark.vllm
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOL = 1e-4
IM_END = 151645
ENGINE = ["backend=vllm", "model.head_dim=32", "budget.context=1024", "num_generations=4", "prompts_per_step=2"]


@pytest.fixture(scope="module")
def model():
    return build_tiny_qwen3(seed=3, head_dim=32).eval()


@pytest.fixture(scope="module")
def backend(model):
    pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs its CPU build)")
    saved = dict(os.environ)
    backend = VllmBackend.from_training_model(model, load_config(None, ENGINE), seed=5)
    yield backend
    backend.close()
    os.environ.clear()  # the backend sets the launcher's variables for a single process
    os.environ.update(saved)
    thread = backend._loop._thread
    assert thread is None or not thread.is_alive()  # the engine loop's thread ends with it


@pytest.fixture
def calls(backend, monkeypatch):
    """Every (prompt ids, SamplingParams, sampled ids) of the engine's requests, as they finish."""
    seen, added = [], {}
    engine = backend.llm.llm_engine
    add_request, step = engine.add_request, engine.step

    def add_spy(request_id, prompt, params, **kw):
        added[request_id] = (prompt["prompt_token_ids"], params)
        return add_request(request_id, prompt, params, **kw)

    def step_spy():
        outputs = step()
        seen.extend((*added.pop(o.request_id), list(o.outputs[0].token_ids)) for o in outputs if o.finished)
        return outputs

    monkeypatch.setattr(engine, "add_request", add_spy)
    monkeypatch.setattr(engine, "step", step_spy)
    return seen


def max_logprob_error(model, rollouts) -> float:
    """|sampler logprob - training model's recompute| over every generated token."""
    batch = collate(rollouts, torch.zeros(len(rollouts)), pad_id=0, device="cpu")
    with torch.no_grad():
        lp = target_logprobs(model, batch.input_ids, batch.mask)
    sel = batch.mask.bool()
    assert sel.any()
    return (lp[sel] - batch.old_logp[sel]).abs().max().item()


def generate(backend, *requests: GenRequest) -> list[GenResult]:
    return asyncio.run(backend.generate(list(requests)))


def test_engine_is_colocated_with_the_cpu_settings(backend):
    llm = backend.llm
    assert type(llm.llm_engine.model_executor).__name__ == "ExecutorWithExternalLauncher"
    assert type(engine_model(llm)).__name__ == "Qwen3ForCausalLM"
    c = llm.llm_engine.vllm_config
    assert c.model_config.dtype == torch.float32 and c.model_config.logprobs_mode == "processed_logprobs"
    assert c.model_config.skip_tokenizer_init and c.model_config.max_model_len == 1024
    assert c.scheduler_config.max_num_seqs == 8  # num_generations x prompts_per_step
    # A sized KV cache, not a share of host RAM; no chunked prefill (seeded requests crash it on CPU).
    assert c.cache_config.kv_cache_memory_bytes == 256 * 2**20
    assert not c.scheduler_config.enable_chunked_prefill and c.scheduler_config.max_num_batched_tokens >= 1024


# ----------------------------------------------------------------------------------- a live env server

def _tool_call_turn(tokenizer, conversation, tools, code: str) -> tuple[dict, list[int]]:
    """A `run_python` call as the model writes it: the template's own render of the assistant turn
    after the generation prompt, through <|im_end|>."""
    call = {"type": "function", "function": {"name": "run_python", "arguments": {"code": code}}}
    assistant = {"role": "assistant", "content": "", "tool_calls": [call]}
    before = tokenizer.apply_chat_template(conversation, tools=tools, add_generation_prompt=True, tokenize=False)
    after = tokenizer.apply_chat_template(conversation + [assistant], tools=tools, tokenize=False)
    assert after.startswith(before)
    text = after[len(before):]
    return assistant, tokenizer.encode(text[:text.index("<|im_end|>") + len("<|im_end|>")], add_special_tokens=False)


class FirstTurnToolCall:
    """Turn 0 is a scripted tool call (a random model writes none; its logprobs are the training
    model's); every later turn is sampled by the real engine, on the env's suffix ids."""

    def __init__(self, backend, model, turn0: list[int]) -> None:
        self.backend, self.model, self.turn0 = backend, model, turn0

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        sampled = iter(await self.backend.generate([r for r in requests if r.turn > 0]))
        return [GenResult(self.turn0, teacher_forced_logprobs(self.model, r.prompt_ids, self.turn0), FinishReason.STOP)
                if r.turn == 0 else next(sampled) for r in requests]


@pytest.mark.docker
def test_multi_turn_through_a_live_env_server(server, backend, model, calls):
    """A tool turn through the real server, then the engine's turn on a token prompt holding the
    server's suffix ids: the ids are the template's render of the conversation, the sampled ids
    appended verbatim; per turn max_tokens = the budget left, tito's stop ids, one seed per
    rollout, and a logprob for every sampled token, equal to the training model's."""
    from transformers import AutoTokenizer

    from tito.fingerprint import read_tokenizer_files
    from tito_assets.qwen_tokenizer import build_tokenizer_dir

    backend.sync_weights(model)
    tokenizer = AutoTokenizer.from_pretrained(build_tokenizer_dir(template="qwen2_5"))
    conversation = [{"role": "user", "content": "What is 6 * 7? Use run_python."}]

    async def go():
        client = AsyncTitoClient(server.address)
        try:
            await client.wait_ready(60)
            reg = await client.register_tokenizer(read_tokenizer_files(build_tokenizer_dir(template="qwen2_5")))
            tools = [t.openai_spec() for t in (await client.environment("python")).tools]
            assistant, turn0 = _tool_call_turn(tokenizer, conversation, tools, "print(6 * 7)")
            prompt = tokenizer.apply_chat_template(conversation, tools=tools, add_generation_prompt=True,
                                                   return_dict=False)
            # The tool suffix takes 15 tokens: the engine's turn then gets what the budget has left, under its cap.
            limits = RolloutLimits(budget=len(prompt) + len(turn0) + 60, per_turn_cap=64, reserve=0, max_turns=3)
            rec = RecordingClient(client)
            specs = [RolloutSpec(group=0, messages=conversation) for _ in range(4)]
            rollouts, stats = await run_rollouts(
                specs, StepSeeds(FirstTurnToolCall(backend, model, turn0), seed=0, step=1, specs=specs), rec, "python",
                reg.fingerprint, limits, reg.stop_token_ids, gen_batch_wait_s=0.01)
            return rollouts, stats, rec, reg, tools, assistant, turn0, limits
        finally:
            await client.close()

    rollouts, stats, rec, reg, tools, assistant, turn0, limits = asyncio.run(go())
    assert stats.aborted_attempts == 0 and len(rollouts) == 4
    for r in rollouts:
        (step0, *_) = rec.steps[r.session_id]
        assert step0.result.status is StepStatus.OK and step0.result.tool_messages[0].content == "42"
        tool = {"role": "tool", "content": "42", "name": "run_python",
                "tool_call_id": step0.result.tool_messages[0].tool_call_id}
        rendered = tokenizer.apply_chat_template(conversation + [assistant, tool], tools=tools,
                                                 add_generation_prompt=True, return_dict=False)
        assert r.ids[:len(rendered)] == rendered  # the template's render of the conversation so far
        assert r.mask == [0] * r.prompt_len + [1] * len(turn0) + [0] * len(step0.result.suffix_ids) + \
            [1] * (len(r.ids) - len(rendered))
        assert len(r.turns) == 2 and r.status is Status.TRUNCATED and r.truncation is TruncationCause.LENGTH
        r.check()
    # What the engine sampled is what the rollouts hold after the render, id for id.
    assert sorted(r.ids[len(rendered):] for r in rollouts) == sorted(ids for _, _, ids in calls)
    assert len(calls) == 4
    for prompt, p, ids in calls:
        assert prompt == rendered
        assert p.max_tokens == limits.budget - len(prompt) < 64 and len(ids) == p.max_tokens  # the budget left
        assert list(p.stop_token_ids) == list(reg.stop_token_ids) and p.ignore_eos and p.logprobs == 0 and p.n == 1
    assert len({p.seed for _, p, _ in calls}) == 4  # one seed per rollout
    assert max_logprob_error(model, rollouts) < TOL


# ----------------------------------------------------------------------------------- the engine alone

class ToolEnv(InProcessEnv):
    """Every stopped turn runs a 'tool' (6 suffix ids) until the third, which ends the episode."""

    async def open(self, request):
        return OpenedSession(f"s{json.loads(request.env_args_json)['i']}", tuple(range(1000, 1010)), tools=())

    async def step(self, request):
        if request.seq == 3:
            return StepResult(seq=request.seq, status=StepStatus.EPISODE_END, reward=1.0)
        return StepResult(seq=request.seq, status=StepStatus.OK, suffix_ids=tuple(range(3000, 3006)))

    async def close_session(self, session_id):
        return True


def rollouts_through(backend, n=4, limits=RolloutLimits(budget=48, per_turn_cap=8, reserve=0, max_turns=4)):
    specs = [RolloutSpec(group=0, env_args={"i": i}) for i in range(n)]
    return asyncio.run(run_rollouts(specs, StepSeeds(backend, seed=0, step=1, specs=specs), ToolEnv(), "python", "",
                                    limits, [IM_END], gen_batch_wait_s=0.01))


def test_finish_reasons(backend, model):
    backend.sync_weights(model)
    # Greedy continuations; one whose first two ids differ, to stop on the second.
    prompt, greedy = next((p, g) for p in ([7, 8, 9 + k] for k in range(20))
                          if len(set((g := generate(backend, GenRequest(p, 4, (IM_END,), temperature=0.0))[0]).ids[:2])) == 2)
    assert greedy.finish_reason is FinishReason.LENGTH and len(greedy.ids) == 4
    first, second = greedy.ids[:2]
    stopped = generate(backend, GenRequest(prompt, 4, (first,), temperature=0.0))[0]
    assert stopped.ids == [first] and stopped.finish_reason is FinishReason.STOP  # the stop id is kept
    at_cap = generate(backend, GenRequest(prompt, 2, (second,), temperature=0.0))[0]
    assert at_cap.ids == [first, second] and at_cap.finish_reason is FinishReason.STOP  # a stop id at the cap


def test_missing_logprobs_abort_with_the_real_output_shape(backend, monkeypatch):
    """With `logprobs=None` the engine returns `CompletionOutput.logprobs is None`: the rollout aborts,
    is retried, and is dropped. (Partial or misaligned lists, which this engine never returns, are
    covered on output-shaped objects in test_vllm_helpers.py.)"""
    from trainer.backends import vllm_backend

    real = vllm_backend.sampling_params_kwargs
    monkeypatch.setattr(vllm_backend, "sampling_params_kwargs", lambda r: {**real(r), "logprobs": None})
    rollouts, stats = rollouts_through(backend, n=2)
    assert rollouts == [] and stats.dropped == 2 and stats.aborted_attempts == 4
    assert all("returned no logprobs" in reason for reason in stats.abort_reasons)


def test_optimizer_step_then_push_the_engine_follows(backend, model):
    """After an optimizer step the engine samples from the new weights once they are pushed, and
    the push resets the prefix cache (else blocks computed with the old weights are reused)."""
    backend.sync_weights(model)
    long = GenRequest(list(range(2000, 2260)), 6, (IM_END,), seed=1)  # 260 tokens: two 128-token blocks cached
    generate(backend, long)
    batch = torch.randint(0, 5000, (2, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=5e-2)
    model.train()
    model(input_ids=batch, labels=batch).loss.backward()
    opt.step()
    model.eval()
    before, _ = rollouts_through(backend, n=2)
    assert max_logprob_error(model, before) > 1e-2  # the engine still has the old weights
    backend.sync_weights(model)
    from vllm import SamplingParams

    again = backend.llm.generate([{"prompt_token_ids": long.prompt_ids}],
                                 SamplingParams(max_tokens=2, logprobs=0, seed=1, detokenize=False), use_tqdm=False)
    assert again[0].num_cached_tokens == 0  # nothing from before the push was reused
    after, stats = rollouts_through(backend, n=4)
    assert stats.aborted_attempts == 0 and max_logprob_error(model, after) < TOL


def test_training_loop_pushes_after_every_step(backend, model, tmp_path):
    """train() with the vLLM backend: the next step samples from the updated policy (ratio 1 between
    the sampler and the recompute, though the weights changed)."""
    from trainer.setup import Run
    from trainer.tasks import TokenSubsetTask
    from trainer.train import train

    cfg = load_config(None, [*ENGINE, "task.name=token_subset", "budget.context=24", "budget.per_turn=8",
                             "budget.reserve=0", "budget.max_turns=1", "steps=2", "learning_rate=0.05",
                             "progress=false", "save_checkpoint=false", f"output_dir={tmp_path}"])
    backend.sync_weights(model)
    start = [p.detach().clone() for p in model.parameters()]
    run = Run(model=model, backend=backend, task=TokenSubsetTask(vocab_size=model.config.vocab_size, seed=0,
                                                                 prompt_len=8), env=None, stop_token_ids=[IM_END], pad_id=0)
    history = asyncio.run(train(run, cfg))
    assert [m["rollouts"] for m in history] == [8, 8]
    assert any(not torch.equal(a, p) for a, p in zip(start, model.parameters()))
    for m in history:
        assert abs(m["ratio_mean"] - 1) < 1e-4 and m["clip_frac"] == 0, m


@pytest.mark.timeout(240)
def test_a_big_seeded_batch_is_not_chunked(backend, model):
    """64 seeded requests of 231 tokens, more than vLLM's default 4096 tokens a step: with chunked
    prefill a prompt split over two steps crashes the CPU engine and hangs it. Seeds hold whatever
    the batch: a request samples the same ids alone as in the batch."""
    backend.sync_weights(model)
    reqs = [GenRequest(list(range(100, 330)) + [i], 8, (IM_END,), seed=10**15 + i) for i in range(64)]
    out = generate(backend, *reqs)
    assert all(len(r.ids) == 8 and r.logprobs is not None for r in out)
    assert [r.ids for r in generate(backend, *reqs[:3])] == [r.ids for r in out[:3]]


def test_a_request_joins_the_running_batch(backend, model):
    """Continuous batching: a request handed over while a long one generates joins the engine's
    running batch and comes back first, as a rollout back from its tool call does; each samples what
    it samples alone (its seed)."""
    backend.sync_weights(model)
    long = GenRequest(list(range(100, 120)), 300, (IM_END,), seed=21)
    short = GenRequest(list(range(200, 220)), 4, (IM_END,), seed=22)

    async def overlapped():
        running = asyncio.ensure_future(backend.generate([long]))
        await asyncio.sleep(0.3)  # the long request is generating
        first = (await backend.generate([short]))[0]
        assert not running.done()
        return (await running)[0], first

    long_out, short_out = asyncio.run(overlapped())
    assert len(long_out.ids) == 300 and len(short_out.ids) == 4
    assert [r.ids for r in generate(backend, long, short)] == [long_out.ids, short_out.ids]


def test_a_refused_request_fails_alone(backend):
    """A request the engine cannot take (here: no stop ids) comes back failed, with why; the others
    of the same call are served, and the engine goes on."""
    bad, good = GenRequest([1, 2, 3], 4, ()), GenRequest([1, 2, 3], 4, (IM_END,), seed=1)
    out = generate(backend, bad, good)
    assert out[0].ids == [] and "stop_token_ids must not be empty" in out[0].error
    assert len(out[1].ids) == 4 and not out[1].error
    assert generate(backend, good)[0].ids == out[1].ids


def test_sleep_and_wake_on_the_real_engine(backend, model):
    """The sleep/wake sequence of `vllm.sleep_level` (CUDA's memory saver) against the real API: on
    the CPU build sleeping frees nothing, which is why the config refuses it there (next test),
    but the calls, the order and the weights after waking are the same."""
    sleepy = VllmBackend(backend.llm, sleep_level=2, model=model)
    sleepy.release_memory()
    assert backend.llm.llm_engine.is_sleeping() and sleepy.asleep
    sleepy.sync_weights(model)  # wake the weights, push, wake the KV cache
    assert not backend.llm.llm_engine.is_sleeping()
    sleepy.release_memory()
    rollouts, stats = rollouts_through(sleepy, n=2)  # asleep at the next generation: wakes with the weights
    assert stats.aborted_attempts == 0 and not sleepy.asleep
    assert max_logprob_error(model, rollouts) < TOL


def test_sleep_level_is_refused_on_cpu(model):
    pytest.importorskip("vllm")
    cfg = load_config(None, [*ENGINE, "vllm.sleep_level=1"])
    with pytest.raises(ConfigError, match="vLLM's CPU build has no sleep mode.*set vllm.sleep_level: 0"):
        VllmBackend.from_training_model(model, cfg, seed=0)


def test_head_dim_16_is_refused_before_the_engine_starts():
    pytest.importorskip("vllm")
    cfg = load_config(None, ["backend=vllm"])
    with pytest.raises(ConfigError, match=r"head_dim 16 .*\(32, 64.*set model.head_dim: 32"):
        VllmBackend.from_training_model(build_tiny_qwen3(vocab_size=512), cfg, seed=0)


def test_missing_vllm_says_what_to_install(monkeypatch, capsys, tmp_path):
    from trainer.__main__ import main

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    rc = main(["--set", "backend=vllm", "--set", "task.name=token_subset", "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 1 and "scripts/setup.sh installs it" in err and "backend: transformers" in err
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before anything was loaded
