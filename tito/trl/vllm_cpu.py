"""TRL's vLLM modes (`GRPOConfig(use_vllm=True, vllm_mode="colocate" | "server")`) on vLLM's CPU build.

    from tito.trl import vllm_cpu
    vllm_cpu.patch()                      # before GRPOTrainer(...): TRL builds its engine or client in __init__
    trainer = GRPOTrainer(model=model_loaded_from_a_folder, ..., rollout_func=tito.rollout_func, ...)

Server mode also needs a server started by `python -m tito.trl.vllm_server --model DIR` (TRL's
`trl vllm-serve` fails on the CPU build: see that module) on the same machine, or one sharing
`sync_dir` with the trainer.

What TRL 1.16 does (trl/generation/vllm_generation.py, vllm_client.py) and what the CPU build needs:

- colocate: TRL builds `LLM(model=model.name_or_path, ..., max_num_batched_tokens=4096)` with no
  dtype, and pushes weights tensor by tensor with the engine model's `load_weights`. On the CPU
  build that push fails before the first generation (`'Parameter' object has no attribute
  'weight_loader'`: linear weights are packed into oneDNN handles), and "auto" turns a float32
  checkpoint into bfloat16 (sampled and recomputed logprobs then differ by ~5e-3). So the engine
  gets `dtype` (float32 by default), eager mode (no torch.compile warm-up) and
  `tito.rollout.vllm.cpu_engine_kwargs` (a sized KV cache; no chunked prefill, which crashes seeded
  requests on CPU), and the push is tito's (`push_weights`: one `reload_weights` call with TRL's
  own parameter walk plus the tied lm_head, then the prefix-cache reset). No sleep mode on CPU:
  `vllm_enable_sleep_mode=True` is refused with that reason.
- server: TRL streams weights over NCCL (`VLLMClient.init_communicator`, refused on CPU: "needs a
  CUDA device"), so `GRPOTrainer(vllm_mode="server")` cannot even be built. The patch skips the
  communicator and syncs through disk instead: the trainer's main process writes the weights to
  `sync_dir/model.safetensors`, asks the server to `reload_weights` from there (its `/collective_rpc`
  endpoint, which `VLLM_SERVER_DEV_MODE=1` opens) and resets its prefix cache.

On a GPU build `patch()` changes nothing and returns False. TRL hands vLLM the model's folder
(`model.name_or_path`): load the model from a folder that also holds the tokenizer files.
"""

from __future__ import annotations

import functools
import itertools
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tito.rollout.vllm import cpu_engine_kwargs, on_cpu_platform, push_weights, weights_for_vllm

_PATCHED = "_tito_cpu_patch"


def patch(*, dtype: str = "float32", kv_cache_memory_bytes: int | None = None,
          sync_dir: str | Path | None = None) -> bool:
    """Make TRL's vLLM modes work on vLLM's CPU build (see the module docstring); idempotent.

    dtype: the colocated engine's (the training model's dtype). kv_cache_memory_bytes: its KV
    cache's size (default 256 MiB). sync_dir: server mode, the folder the weights go through
    (default: a temporary one; the server must read the same path). Returns whether the CPU patch
    is in place."""
    if not on_cpu_platform():
        return False
    import trl.generation.vllm_client as vllm_client
    import trl.generation.vllm_generation as vllm_generation

    llm = vllm_generation.LLM
    base = getattr(llm, _PATCHED, llm)  # a second call replaces the first one's settings
    vllm_generation.LLM = _cpu_llm(base, dtype=dtype, kv_cache_memory_bytes=kv_cache_memory_bytes)
    cls = vllm_generation.VLLMGeneration
    trl_sync = getattr(cls.sync_weights, _PATCHED, cls.sync_weights)
    cls.sync_weights = _cpu_sync_weights(trl_sync, Path(sync_dir or tempfile.mkdtemp(prefix="tito-vllm-sync-")))
    client = vllm_client.VLLMClient
    if not getattr(client.init_communicator, _PATCHED, None):
        client.init_communicator = _no_communicator(client.init_communicator)
    return True


def is_patched(vllm_generation: Any) -> bool:
    """Whether a VLLMGeneration pushes weights the way the CPU build needs (patch ran)."""
    return bool(getattr(type(vllm_generation).sync_weights, _PATCHED, None))


def _cpu_llm(make: Callable[..., Any], *, dtype: str, kv_cache_memory_bytes: int | None):
    @functools.wraps(make)
    def llm(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("enable_sleep_mode"):
            raise ValueError("vLLM's CPU build has no sleep mode (LLM(enable_sleep_mode=True) is refused on the CPU "
                             "platform): build the GRPOConfig with vllm_enable_sleep_mode=False")
        if kwargs.get("max_model_len") is None:
            raise ValueError("on vLLM's CPU build chunked prefill is off, so each step's token budget must hold a "
                             "whole prompt: set GRPOConfig(vllm_max_model_length=...)")
        kwargs.update(dtype=dtype, enforce_eager=True,
                      **cpu_engine_kwargs(max_model_len=kwargs["max_model_len"],
                                          kv_cache_memory_bytes=kv_cache_memory_bytes))
        return make(*args, **kwargs)

    setattr(llm, _PATCHED, make)
    return llm


def _cpu_sync_weights(trl_sync: Callable[[Any], None], sync_dir: Path):
    @functools.wraps(trl_sync)
    def sync_weights(self: Any) -> None:
        weights = weights_for_vllm(itertools.chain(self._iter_named_params(), _tied_head(self)))
        if self.mode == "colocate":
            push_weights(self.llm, weights)
        elif self.accelerator.is_main_process:
            _push_through_disk(self.vllm_client, weights, sync_dir)
        else:
            for _ in weights:  # take part in the gather collectives of a sharded model
                pass

    setattr(sync_weights, _PATCHED, trl_sync)
    return sync_weights


def _push_through_disk(client: Any, weights: Iterator[tuple[str, Any]], sync_dir: Path) -> None:
    """Write the weights where the server can read them, have it reload them, drop its prefix cache."""
    from safetensors.torch import save_file

    sync_dir.mkdir(parents=True, exist_ok=True)
    tmp = sync_dir / ".model.safetensors.tmp"
    # Copies: safetensors refuses tensors that share memory (a tied lm_head and the embedding).
    save_file({name: t.detach().cpu().clone() for name, t in weights}, str(tmp))
    tmp.replace(sync_dir / "model.safetensors")  # the server never reads a half-written file
    response = client.session.post(f"{client.base_url}/collective_rpc", json={
        "method": "reload_weights", "kwargs": {"weights_path": str(sync_dir), "is_checkpoint_format": True}})
    if response.status_code == 404:
        raise RuntimeError(f"the vLLM server at {client.base_url} has no /collective_rpc endpoint: start it with "
                           "`python -m tito.trl.vllm_server` (which sets VLLM_SERVER_DEV_MODE=1)")
    if response.status_code != 200:
        raise RuntimeError(f"the vLLM server could not reload the weights from {sync_dir} "
                           f"({response.status_code}): {response.text[:500]}")
    client.reset_prefix_cache()


def _no_communicator(init_communicator: Callable[..., None]):
    @functools.wraps(init_communicator)
    def skip(self: Any, device: Any = 0) -> None:
        """No NCCL group on the CPU build: the weights go through disk (see tito.trl.vllm_cpu)."""

    setattr(skip, _PATCHED, init_communicator)
    return skip


def _tied_head(vg: Any) -> Iterator[tuple[str, Any]]:
    """lm_head.weight of a tied model, which TRL's walk over named_parameters() leaves out."""
    model = vg.accelerator.unwrap_model(vg.model)
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        yield "lm_head.weight", model.get_output_embeddings().weight.data
