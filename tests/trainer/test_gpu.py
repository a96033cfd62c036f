"""GPU checks (skipped without CUDA): sampled logprobs agree with the training model's recompute
(the loop sampler, the compiled static sampler, vLLM); fsdp on one GPU with CPU offload.

Tolerance: 2e-2 absolute per token in float32 on CUDA (batched KV-cache decoding vs one full
forward differ only by kernel reduction order; bf16 would need ~1e-1).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys

import pytest
import torch

from tito.rollout.generation import GenRequest
from tito.rollout.state import Rollout
from trainer.model import build_tiny_qwen3, collate, target_logprobs

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
TOL = 2e-2


def _tool_turn_ids(tokenizer) -> list[int]:
    text = '<tool_call>\n' + json.dumps({"name": "run_python", "arguments": {"code": "print(6*7)"}}) + \
        '\n</tool_call><|im_end|>'
    return tokenizer.encode(text, add_special_tokens=False).ids


def test_cuda_backend_multi_turn_with_tools_logprobs_match(tmp_path):
    from tokenizers import Tokenizer

    from tests.harness import docker_available, start_server
    from tito.client import AsyncTitoClient
    from tito.fingerprint import read_tokenizer_files
    from tito_assets.qwen_tokenizer import build_tokenizer_dir
    from trainer.backends.hf import TransformersBackend
    from trainer.rollout import RolloutLimits, RolloutSpec, run_rollouts

    why = docker_available()
    if why:
        pytest.skip(why)
    files = read_tokenizer_files(build_tokenizer_dir(template="qwen2_5"))
    tok = Tokenizer.from_str(files["tokenizer.json"].decode())
    model = build_tiny_qwen3(seed=0).cuda().eval()
    hf = TransformersBackend(model, seed=0)
    forced = _tool_turn_ids(tok)

    class FirstTurnToolCall:
        """Turn 0 is a scripted tool call (a random model writes none); later turns are sampled
        by the CUDA backend, so tools run and the model's own sampled logprobs are checked."""

        def sync_weights(self, m):
            pass

        async def generate(self, reqs):
            out = await hf.generate([r for r in reqs if r.turn > 0]) if any(r.turn for r in reqs) else []
            it = iter(out)
            res = []
            for r in reqs:
                if r.turn == 0:
                    from tito.rollout.generation import FinishReason, GenResult
                    from trainer.backends.scripted import teacher_forced_logprobs
                    res.append(GenResult(forced, teacher_forced_logprobs(model, r.prompt_ids, forced),
                                         FinishReason.STOP))
                else:
                    res.append(next(it))
            return res

    srv = start_server(tmp_path)
    try:
        async def go():
            client = AsyncTitoClient(srv.address)
            await client.wait_ready(120)
            reg = await client.register_tokenizer(files)
            specs = [RolloutSpec(group=0, messages=[{"role": "user", "content": "What is 6*7?"}])
                     for _ in range(4)]
            limits = RolloutLimits(budget=1024, per_turn_cap=32, reserve=16, max_turns=2)
            try:
                return await run_rollouts(specs, FirstTurnToolCall(), client, "python", reg.fingerprint,
                                          limits, reg.stop_token_ids, gen_batch_wait_s=0.02)
            finally:
                await client.close()

        rollouts, stats = asyncio.run(go())
    finally:
        srv.terminate()
    assert len(rollouts) == 4 and stats.aborted_attempts == 0
    for r in rollouts:
        assert r.tool_calls == 1 and len(r.turns) == 2
    batch = collate(rollouts, torch.zeros(len(rollouts)), pad_id=0, device="cuda")
    with torch.no_grad():
        lp = target_logprobs(model, batch.input_ids, batch.mask)
    sel = batch.mask.bool()
    diff = (lp[sel] - batch.old_logp[sel]).abs().max().item()
    print(f"max |sampled - recomputed| logprob on CUDA: {diff:.2e}")
    assert diff < TOL


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
def test_vllm_backend_logprobs_match(tmp_path):
    from trainer.backends.vllm_backend import VllmBackend
    from trainer.config import load_config

    model = build_tiny_qwen3(seed=0).cuda()
    cfg = load_config(None, ["budget.context=256", "model.dtype=float32"])
    backend = VllmBackend.from_training_model(model, cfg, seed=0)
    reqs = [GenRequest(prompt_ids=[151644, 872, 198, 9707], max_new=16, stop_token_ids=(151645,))
            for _ in range(4)]
    results = asyncio.run(backend.generate(reqs))
    rollouts = []
    for req, res in zip(reqs, results):
        assert res.logprobs is not None and len(res.logprobs) == len(res.ids)
        r = Rollout(budget=256)
        r.start(req.prompt_ids)
        r.append_generated(res.ids, res.logprobs, res.finish_reason, req.max_new)
        rollouts.append(r)
    batch = collate(rollouts, torch.zeros(4), pad_id=0, device="cuda")
    with torch.no_grad():
        lp = target_logprobs(model, batch.input_ids, batch.mask)
    sel = batch.mask.bool()
    assert (lp[sel] - batch.old_logp[sel]).abs().max().item() < TOL
    backend.sync_weights(model)  # weight push path runs


def test_static_sampler_compiled_matches_recompute():
    """transformers.sampler: static on CUDA, compiled (CUDA graphs): the sampled tokens' logprobs are
    the training model's, stops are ids, a seeded row repeats alone."""
    from tito.rollout.generation import FinishReason
    from trainer.backends.hf import TransformersBackend

    model = build_tiny_qwen3(seed=0).cuda().eval()
    backend = TransformersBackend(model, sampler="static", compile=True, max_len=256, max_batch_size=8)
    reqs = [GenRequest(prompt_ids=[151644, 872, 198, 9707 + i], max_new=24 + i, stop_token_ids=(151645,),
                       temperature=[1.0, 0.7, 0.0][i % 3], seed=i) for i in range(6)]
    results = asyncio.run(backend.generate(reqs))
    rollouts = []
    for req, res in zip(reqs, results):
        assert len(res.ids) == len(res.logprobs) and res.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        r = Rollout(budget=256)
        r.start(req.prompt_ids)
        r.append_generated(res.ids, res.logprobs, res.finish_reason, req.max_new)
        rollouts.append(r)
    for temperature in (1.0, 0.7):
        rows = [r for r, q in zip(rollouts, reqs) if q.temperature == temperature]
        batch = collate(rows, torch.zeros(len(rows)), pad_id=0, device="cuda")
        with torch.no_grad():
            lp = target_logprobs(model, batch.input_ids, batch.mask, temperature)
        sel = batch.mask.bool()
        assert (lp[sel] - batch.old_logp[sel]).abs().max().item() < TOL
    (alone,) = asyncio.run(backend.generate([reqs[1]]))
    assert alone.ids == results[1].ids


def test_fsdp_on_one_gpu_with_cpu_offload(tmp_path):
    """distributed.strategy: fsdp under torchrun with one process on the GPU, CPU offload, bf16 compute:
    two steps run, the sampler's copy follows the shards (ratio ~1)."""
    from tests.trainer.test_distributed import launch, rows, sets

    out = tmp_path / "fsdp1"
    launch([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
            "-m", "tests.trainer.dist_run", str(out), *sets([
                "task.name=token_subset", "task.params={fraction: 0.5, prompt_len: 8}", "model.vocab_size=2048",
                "model.device=cuda", "budget.context=40", "budget.per_turn=16", "budget.reserve=0",
                "budget.max_turns=1", "num_generations=4", "prompts_per_step=2", "steps=2", "progress=false",
                "distributed.strategy=fsdp", "distributed.cpu_offload=true", "model.activation_checkpointing=true",
                "save_steps=1"])])
    metrics = rows(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(abs(m["ratio_mean"] - 1) < 2e-2 for m in metrics)
    assert (out / "checkpoints" / "step-000002" / "sharded" / ".metadata").is_file()
