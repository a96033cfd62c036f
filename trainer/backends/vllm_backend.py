"""vLLM backend (GPU, colocated with training; optional extra `vllm`).

Thin on purpose: everything testable without vLLM is in `vllm_helpers.py`. Written against
vLLM's documented offline API: `LLM.generate(TokensPrompt, SamplingParams)`; weights are pushed
from the training model after each optimizer step through the worker's `model.load_weights`.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from pathlib import Path

from trainer.backends.base import GenRequest, GenResult
from trainer.backends.vllm_helpers import (extract_result, sampling_params_kwargs, token_prompt,
                                           weights_for_vllm)


def _vllm_model(llm):
    """The torch model inside a colocated vLLM engine (V0 and V1 layouts)."""
    executor = llm.llm_engine.model_executor
    worker = executor.driver_worker
    worker = getattr(worker, "worker", worker)  # V1 wraps the worker
    return worker.model_runner.model


class VllmBackend:
    def __init__(self, llm, *, seed: int | None = None, tied_embeddings: bool = True) -> None:
        self.llm = llm
        self.seed = seed
        self.tied_embeddings = tied_embeddings
        self._lock = threading.Lock()

    @classmethod
    def from_training_model(cls, model, cfg, *, seed: int) -> VllmBackend:
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError("backend 'vllm' needs the optional extra: pip install 'tito[vllm]'") from e
        # vLLM loads from disk: write the current weights once, then sync in memory.
        d = Path(tempfile.mkdtemp(prefix="tito-vllm-"))
        model.save_pretrained(d)
        llm = LLM(model=str(d), skip_tokenizer_init=True, seed=seed, dtype=cfg.model.dtype,
                  gpu_memory_utilization=cfg.vllm.gpu_memory_utilization,
                  enforce_eager=cfg.vllm.enforce_eager, max_model_len=cfg.budget.context,
                  logprobs_mode=cfg.vllm.logprobs_mode)
        return cls(llm, seed=seed,
                   tied_embeddings=bool(getattr(model.config, "tie_word_embeddings", False)))

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return await asyncio.to_thread(self._generate_sync, requests)

    def _generate_sync(self, requests: list[GenRequest]) -> list[GenResult]:
        from vllm import SamplingParams

        prompts = [token_prompt(r) for r in requests]
        params = [SamplingParams(**sampling_params_kwargs(r, self.seed)) for r in requests]
        with self._lock:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [extract_result(o.outputs[0], r) for o, r in zip(outputs, requests)]

    def sync_weights(self, model) -> None:
        with self._lock:
            _vllm_model(self.llm).load_weights(
                weights_for_vllm(model.named_parameters(), tied_embeddings=self.tied_embeddings))
            # Cached KV blocks were computed with the old weights.
            if hasattr(self.llm, "reset_prefix_cache"):
                self.llm.reset_prefix_cache()
