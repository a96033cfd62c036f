"""vLLM backend, colocated: the engine runs inside the training process, on the same GPU.

As TRL's colocate mode (trl/generation/vllm_generation.py) does it: `LLM(...,
distributed_executor_backend="external_launcher")` with RANK/LOCAL_RANK/WORLD_SIZE from the launcher
(torchrun / accelerate; defaults for a single process), so vLLM runs its engine core and worker in
this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, which vLLM also sets itself for this backend).
That keeps `llm.llm_engine.model_executor.driver_worker.worker.model_runner.model` reachable: after
each optimizer step the training weights are copied into it with the model's own `load_weights`
(no disk, no second process), then the prefix cache is reset, since cached KV blocks were computed
with the old weights. Each data-parallel rank has its own engine (tensor parallel size 1).

Memory (config `vllm.sleep_level`): with 1 or 2 the engine sleeps while the policy trains
(`LLM.sleep`: level 1 offloads its weights to CPU, level 2 drops them; both drop the KV cache) and
wakes in `sync_weights`: weights first, so `load_weights` writes to mapped memory, then the KV
cache. Level 2 is enough here because every wake-up is followed by a full weight load.

Written against vLLM 0.33's `vllm/entrypoints/llm.py` (`generate`, `sleep`, `wake_up`,
`reset_prefix_cache`), `vllm/v1/engine/llm_engine.py` (`model_executor` exists only without
multiprocessing) and `vllm/v1/executor/uniproc_executor.py` (`ExecutorWithExternalLauncher`);
tested against a fake with the same signatures (tests/trainer/test_vllm_backend.py). vLLM cannot
be installed on the project's machines, so it has not run against the real engine here.
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
from tito.rollout.vllm import extract_result, launcher_env, sampling_params_kwargs, token_prompt, weights_for_vllm

log = logging.getLogger(__name__)

INSTALL_HINT = ("backend 'vllm' needs vLLM on a CUDA machine: pip install 'tito[vllm]' (vLLM 0.33 needs "
                "transformers>=5.16.1,<5.21, as tito does); or use backend: transformers")


def require_vllm() -> None:
    """Fail early, before any model is loaded, when vLLM is missing."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e


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


class VllmBackend:
    def __init__(self, llm, *, tied_embeddings: bool = True, sleep_level: int = 0, model=None) -> None:
        self.llm = llm
        self.tied_embeddings = tied_embeddings
        self.sleep_level = sleep_level
        self.model = model  # the training model, to refill a sleeping engine
        self.asleep = False
        self._lock = threading.Lock()  # one engine call at a time (generate runs in a worker thread)
        self._tmp: tempfile.TemporaryDirectory | None = None

    @classmethod
    def from_training_model(cls, model, cfg, *, seed: int) -> VllmBackend:
        require_vllm()
        from vllm import LLM

        os.environ.update(launcher_env(os.environ, _free_port()))
        tmp = None
        path = cfg.model.path
        if not Path(path).is_dir():
            # vLLM loads from disk: write the initial weights once; later syncs are in memory.
            tmp = tempfile.TemporaryDirectory(prefix="tito-vllm-")
            model.save_pretrained(tmp.name)
            path = tmp.name
        extra = {"max_num_seqs": cfg.vllm.max_num_seqs} if cfg.vllm.max_num_seqs else {}
        llm = LLM(model=str(path), skip_tokenizer_init=True, seed=seed, dtype=cfg.model.dtype,
                  gpu_memory_utilization=cfg.vllm.gpu_memory_utilization, enforce_eager=cfg.vllm.enforce_eager,
                  max_model_len=cfg.budget.context, logprobs_mode=cfg.vllm.logprobs_mode,
                  distributed_executor_backend="external_launcher",
                  enable_sleep_mode=cfg.vllm.sleep_level > 0, **extra)
        backend = cls(llm, tied_embeddings=bool(getattr(model.config, "tie_word_embeddings", False)),
                      sleep_level=cfg.vllm.sleep_level, model=model)
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
            engine_model(self.llm).load_weights(
                weights_for_vllm(model.named_parameters(), tied_embeddings=self.tied_embeddings))
            if self.asleep:
                self.llm.wake_up(tags=["kv_cache"])
                self.asleep = False
            # Cached KV blocks were computed with the old weights.
            if self.llm.reset_prefix_cache() is False:
                log.warning("vLLM did not reset its prefix cache (requests still running?)")
