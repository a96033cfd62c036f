"""One GRPO micro-step of the trainer (target_logprobs + grpo_loss + backward, `train.micro_batch_backward`)
and the transformers backend's samplers, on a model of a real shape with random weights.

    .venv/bin/python bench/bench_train_step.py --shape qwen3-0.6b --batch 16 --seq 1024             # CUDA
    .venv/bin/python bench/bench_train_step.py --shape qwen3-0.6b --layers 4 --vocab 4096 --batch 4 --seq 512 \\
        --sampler-rows 8 --sampler-tokens 32                                                       # CPU slice
    torchrun --nproc-per-node 8 bench/bench_train_step.py --shape qwen3-8b --strategy fsdp --sampler none
    .venv/bin/python bench/bench_train_step.py --memory-table                                      # computed

Each run measures its own baseline: activation checkpointing off, then on (`--checkpointing both`,
the default), and the `loop` sampler, then `static` (`--sampler both`). Per configuration: seconds
per micro-step (median of `--repeat`), tokens/s (batch x seq / that), peak memory per rank, and the
sampler's generated tokens/s at `--sampler-rows` x `--sampler-tokens` (no stop ids, so every row
runs to the end; short prompts). Also the training state a rank would hold (its weights or shards,
gradients and Adam's two moments, fp32: 16 bytes per parameter it holds), computed from its tensors. The memory is `torch.cuda.max_memory_allocated` on CUDA (weights,
gradients, optimizer-free: no optimizer step is taken), and on the CPU the peak of tensors allocated
during one micro-step on top of the weights (trainer/memory.py; the CPU has no allocator counters).

`--strategy fsdp` (under torchrun) shards the model as the trainer does (trainer/fsdp.py: float32
masters, `--dtype` compute, `--cpu-offload`); the sampler then runs on rank 0 on a whole copy in
`--dtype`, as the backend does. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

# Real Qwen3 shapes (their config.json); random weights.
SHAPES: dict[str, dict] = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=151669, tie_word_embeddings=True),
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    "qwen3-32b": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
}
GIB = 2**30


def qwen3_config(shape: str, layers: int | None = None, vocab: int | None = None):
    from transformers import Qwen3Config

    kw = dict(SHAPES[shape])
    if layers:
        kw["num_hidden_layers"] = layers
    if vocab:
        kw["vocab_size"] = vocab
    big = kw["vocab_size"] > 151645
    return Qwen3Config(**kw, max_position_embeddings=40960, rope_theta=1_000_000, rms_norm_eps=1e-6,
                       bos_token_id=None, eos_token_id=151645 if big else None, pad_token_id=151643 if big else None)


def build(config, dtype: torch.dtype, device) -> torch.nn.Module:
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        return Qwen3ForCausalLM(config).to(dtype)


def parameter_count(config) -> int:
    with torch.device("meta"):
        from transformers import Qwen3ForCausalLM

        return sum(p.numel() for p in Qwen3ForCausalLM(config).parameters())


def random_batch(config, batch: int, seq: int, device):
    from trainer.model import RolloutBatch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=g)
    mask = torch.zeros(batch, seq - 1, dtype=torch.long)
    mask[:, seq // 4:] = 1  # a prompt quarter, then generated tokens
    adv = torch.randn(batch, generator=g)
    return RolloutBatch(input_ids=ids.to(device), mask=mask.to(device),
                        old_logp=torch.full((batch, seq - 1), float("nan"), device=device), advantages=adv.to(device))


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def micro_steps(model, batch, cfg, repeat: int, device) -> tuple[float, int]:
    """(median seconds per micro-step, peak bytes per rank) of `train.micro_batch_backward`."""
    from trainer.memory import PeakTensorMemory, cuda_peak, cuda_peak_reset
    from trainer.model import target_logprobs
    from trainer.train import micro_batch_backward

    tokens = int(batch.mask.sum())
    model.train()
    with torch.no_grad():  # the sampler's logprobs: the recompute itself (ratio 1)
        lp = target_logprobs(model, batch.input_ids, batch.mask, 1.0)
        batch.old_logp = torch.where(batch.mask.bool(), lp, batch.old_logp)
    micro_batch_backward(model, None, batch, cfg, batch.input_ids.shape[0], tokens)  # warm-up
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        cuda_peak_reset(device)
    times = []
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        micro_batch_backward(model, None, batch, cfg, batch.input_ids.shape[0], tokens)
        sync(device)
        times.append(time.perf_counter() - t0)
    if device.type == "cuda":
        peak = cuda_peak(device)
    else:
        with PeakTensorMemory() as memory:  # untimed: the dispatch mode slows every op
            micro_batch_backward(model, None, batch, cfg, batch.input_ids.shape[0], tokens)
        peak = memory.peak
    model.zero_grad(set_to_none=True)
    return statistics.median(times), peak


def sampler_tokens_per_s(model, kind: str, rows: int, new_tokens: int, device) -> float:
    import asyncio

    from tito.rollout.generation import GenRequest
    from trainer.backends.hf import TransformersBackend

    backend = TransformersBackend(model, sampler=kind, compile=device.type == "cuda", max_len=16 + new_tokens,
                                  max_batch_size=rows, pad_token_id=0)
    vocab = model.config.vocab_size
    requests = [GenRequest(prompt_ids=[(1000 + 16 * i + j) % vocab for j in range(16)], max_new=new_tokens,
                           stop_token_ids=(), temperature=1.0, seed=i) for i in range(rows)]
    asyncio.run(backend.generate(requests[: min(rows, 2)]))  # warm-up (compilation, CUDA graph capture)
    if kind == "static":
        asyncio.run(backend.generate(requests))
    sync(device)
    t0 = time.perf_counter()
    results = asyncio.run(backend.generate(requests))
    sync(device)
    return sum(len(r.ids) for r in results) / (time.perf_counter() - t0)


def memory_table() -> None:
    """Computed memory per rank (GiB) for training with Adam: fp32 masters, gradients and two Adam
    moments = 16 bytes per parameter, divided by the ranks under fsdp; plus the generation copy
    (vLLM's or the transformers backend's, bf16, whole on every rank) and the activations of a
    16 x 1024 micro-step with activation checkpointing (one bf16 hidden state per layer boundary,
    one layer's working set, the LM head's fp32 chunk of 1024 x vocab)."""
    print("| shape | parameters | training state (16 B/param) | per rank, fsdp 8 | per rank, fsdp 16 | "
          "bf16 generation copy | activations 16x1024, checkpointed |")
    print("|---|---|---|---|---|---|---|")
    for shape in ("qwen3-0.6b", "qwen3-1.7b", "qwen3-8b", "qwen3-32b"):
        config = qwen3_config(shape)
        n = parameter_count(config)
        state = 16 * n / GIB
        tokens, h, layers = 16 * 1024, config.hidden_size, config.num_hidden_layers
        boundaries = tokens * h * 2 * layers
        one_layer = tokens * (10 * h + 3 * config.intermediate_size) * 2  # q,k,v,o, norms, MLP's 3 projections
        head = 1024 * config.vocab_size * 4 * 3
        act = (boundaries + one_layer + head) / GIB
        print(f"| {shape} | {n / 1e9:.2f} B | {state:.1f} | {state / 8:.1f} | {state / 16:.1f} | {2 * n / GIB:.1f} | "
              f"{act:.1f} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=list(SHAPES), default="tiny")
    p.add_argument("--layers", type=int, help="fewer decoder layers than the shape has (a slice)")
    p.add_argument("--vocab", type=int, help="a smaller vocabulary (CPU slices: else the LM head is all one measures)")
    p.add_argument("--batch", type=int, default=16, help="sequences per micro-step")
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], help="compute dtype (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--device", default="auto")
    p.add_argument("--strategy", choices=["replicate", "fsdp"], default="replicate")
    p.add_argument("--cpu-offload", action="store_true", help="fsdp on CUDA: FSDP2's CPU offload")
    p.add_argument("--checkpointing", choices=["off", "on", "both"], default="both")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--sampler", choices=["loop", "static", "both", "none"], default="both")
    p.add_argument("--sampler-rows", type=int, default=64)
    p.add_argument("--sampler-tokens", type=int, default=256)
    p.add_argument("--memory-table", action="store_true", help="print the computed memory table and exit")
    a = p.parse_args()
    if a.memory_table:
        memory_table()
        return 0

    from trainer import distributed, fsdp
    from trainer.config import load_config
    from trainer.model import enable_activation_checkpointing
    from trainer.setup import resolve_device

    dist = distributed.init(a.device, fsdp=a.strategy == "fsdp", cpu_offload=a.cpu_offload)
    device = resolve_device(a.device, dist)
    dtype_name = a.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    dtype = getattr(torch, dtype_name)
    torch.set_num_threads(torch.get_num_threads())
    config = qwen3_config(a.shape, a.layers, a.vocab)
    cfg = load_config(None, [])
    batch = random_batch(config, a.batch, a.seq, device)
    n_params = parameter_count(config)
    rows = []
    modes = {"off": [False], "on": [True], "both": [False, True]}[a.checkpointing]
    for checkpointed in modes:
        if a.strategy == "fsdp":
            model = build(config, torch.float32, "cpu" if dist.is_main else "meta")
            full = {k: v.detach() for k, v in model.state_dict().items()} if dist.is_main else {}
            buffers = {k: v.detach().clone() for k, v in model.named_buffers()} if dist.is_main else {}
            if checkpointed:
                enable_activation_checkpointing(model)
            fsdp.shard(model, device=device, param_dtype=dtype_name, reduce_dtype="float32",
                       cpu_offload=a.cpu_offload, full_state=full, full_buffers=buffers)
            del full, buffers
        else:
            model = build(config, dtype, device)
            if checkpointed:
                enable_activation_checkpointing(model)
        seconds, peak = micro_steps(model, batch, cfg, a.repeat, device)
        # This rank's share of the training state: its (shards of the) weights, gradients and Adam's
        # two moments, 4 bytes each in fp32 (no optimizer is made here; this is what one would hold).
        local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
        rows.append({"shape": a.shape, "layers": config.num_hidden_layers, "vocab": config.vocab_size, "params": n_params,
                     "strategy": a.strategy, "ranks": dist.world, "device": str(device), "dtype": dtype_name,
                     "tokens_per_micro_step": a.batch * a.seq, "checkpointing": checkpointed,
                     "s_per_micro_step": round(seconds, 4), "tokens_per_s": round(a.batch * a.seq / seconds, 1),
                     "peak_gib_per_rank": round(peak / GIB, 3), "state_gib_per_rank": round(16 * local / GIB, 3),
                     "peak_is": "cuda max_memory_allocated" if device.type == "cuda" else "tensors allocated by the step"})
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    samplers = {"both": ["loop", "static"], "none": []}.get(a.sampler, [a.sampler])
    sampling = {}
    if samplers and dist.is_main:
        model = build(config, dtype, device).eval()
        for kind in samplers:
            sampling[kind] = round(sampler_tokens_per_s(model, kind, a.sampler_rows, a.sampler_tokens, device), 1)
        del model
    if dist.is_main:
        print(f"{a.shape} ({config.num_hidden_layers} layers, vocabulary {config.vocab_size}, {n_params / 1e9:.3f} B "
              f"parameters), {dtype_name}, "
              f"{a.strategy} x {dist.world}, {device}, micro-step {a.batch} x {a.seq} tokens")
        print("| checkpointing | s / micro-step | tokens/s per rank | peak GiB per rank | training state GiB per rank |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {'on' if r['checkpointing'] else 'off'} | {r['s_per_micro_step']} | {r['tokens_per_s']} | "
                  f"{r['peak_gib_per_rank']} | {r['state_gib_per_rank']} |")
        for kind, rate in sampling.items():
            print(f"sampler {kind}: {rate} tokens/s ({a.sampler_rows} rows x {a.sampler_tokens} tokens)")
        print(json.dumps({"micro_steps": rows, "sampler_tokens_per_s": sampling,
                          "sampler_shape": [a.sampler_rows, a.sampler_tokens]}))
    distributed.shutdown(dist)
    return 0


if __name__ == "__main__":
    sys.exit(main())
