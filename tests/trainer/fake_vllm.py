"""A stand-in for the part of vLLM 0.33 the colocated backend touches, with the same signatures.

vLLM cannot be installed on the project's machines, so the backend is tested at its seams against
this module, installed as `vllm` in `sys.modules`:

- `LLM(model, *, skip_tokenizer_init, seed, dtype, ..., distributed_executor_backend,
  enable_sleep_mode, ...)`: reads RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT for
  "external_launcher" as vLLM's `ExecutorWithExternalLauncher` does, and loads the folder's weights
  into its own copy of the model (a transformers model standing in for vLLM's);
- `generate(prompts, sampling_params, *, use_tqdm)` with token prompts only (the tokenizer is
  skipped), sampling from that copy, returning `RequestOutput`s whose `outputs[0]` has `token_ids`,
  `logprobs` (a dict per position, sampled token included, as with `logprobs=0`), `finish_reason`
  ("stop"/"length") and `stop_reason`;
- `llm.llm_engine.model_executor.driver_worker.worker.model_runner.model.load_weights(iterable)`;
- `reset_prefix_cache()`, `sleep(level)` (which resets the prefix cache first, as `LLM.sleep`
  does) and `wake_up(tags)`. Level 2 sleep overwrites the weights with NaN, so a backend that
  forgot to reload them samples garbage; generating or loading weights while asleep raises.

`SamplingParams` takes only the keyword arguments the real one has (a typo is a TypeError).
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass(kw_only=True)
class SamplingParams:  # field names as in vllm/sampling_params.py
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: Any
    outputs: list[CompletionOutput]
    finished: bool = True


class EngineModel:
    """The engine's model: vLLM's model classes take HF checkpoint names in `load_weights`."""

    def __init__(self, hf_model, owner: LLM) -> None:
        self.hf = hf_model
        self.owner = owner
        self.loads: list[list[str]] = []  # names of each load_weights call

    def load_weights(self, weights) -> set[str]:
        if "weights" in self.owner.asleep:
            raise RuntimeError("load_weights() while the weights sleep: wake_up(tags=['weights']) first")
        self.owner.events.append(("load_weights",))
        params = dict(self.hf.named_parameters())
        names = []
        with torch.no_grad():
            for name, tensor in weights:
                params[name].copy_(tensor)  # KeyError on a name the model does not have, as vLLM
                names.append(name)
        self.loads.append(names)
        return set(names)


class LLM:
    created: list[LLM] = []
    drop_logprobs = False  # set on an instance: outputs come back without logprobs

    def __init__(self, model: str, *, skip_tokenizer_init: bool = False, seed: int = 0, dtype: str = "auto",
                 gpu_memory_utilization: float = 0.9, enforce_eager: bool = False, max_model_len: int | None = None,
                 logprobs_mode: str = "raw_logprobs", distributed_executor_backend: str | None = None,
                 enable_sleep_mode: bool = False, tensor_parallel_size: int = 1, max_num_seqs: int | None = None,
                 **kwargs: Any) -> None:
        from transformers import AutoModelForCausalLM

        if distributed_executor_backend == "external_launcher":
            # ExecutorWithExternalLauncher: env:// rendezvous, rank and device from the launcher.
            self.launch_env = {k: os.environ[k] for k in
                               ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
            assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        self.kwargs = dict(model=model, skip_tokenizer_init=skip_tokenizer_init, seed=seed, dtype=dtype,
                           gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
                           max_model_len=max_model_len, logprobs_mode=logprobs_mode,
                           distributed_executor_backend=distributed_executor_backend,
                           enable_sleep_mode=enable_sleep_mode, tensor_parallel_size=tensor_parallel_size,
                           max_num_seqs=max_num_seqs, **kwargs)
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        self.events: list[tuple] = []
        self.asleep: set[str] = set()
        self.engine_model = EngineModel(hf, self)
        worker = SimpleNamespace(model_runner=SimpleNamespace(model=self.engine_model))
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=worker)))
        self.generator = torch.Generator().manual_seed(seed)
        self.params: list[SamplingParams] = []  # every request's
        self.prompts: list[list[int]] = []
        self._offloaded: dict[str, torch.Tensor] = {}
        LLM.created.append(self)

    # -- generation ------------------------------------------------------------------------------
    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None) -> list[RequestOutput]:
        if self.asleep:
            raise RuntimeError(f"generate() while asleep ({sorted(self.asleep)})")
        if isinstance(prompts, dict):
            prompts = [prompts]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        self.events.append(("generate", len(prompts)))
        out = []
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            if "prompt_token_ids" not in prompt:
                raise ValueError("skip_tokenizer_init=True needs token prompts")
            assert self.kwargs["skip_tokenizer_init"] and p.detokenize is False
            self.prompts.append(list(prompt["prompt_token_ids"]))
            self.params.append(p)
            out.append(RequestOutput(str(i), None, list(prompt["prompt_token_ids"]), None, [self._sample(prompt, p)]))
        return out

    @torch.no_grad()
    def _sample(self, prompt, p: SamplingParams) -> CompletionOutput:
        gen = torch.Generator().manual_seed(p.seed) if p.seed is not None else self.generator
        ids = list(prompt["prompt_token_ids"])
        toks, lps = [], []
        finish, stop_reason = "length", None
        for _ in range(p.max_tokens):
            logits = self.engine_model.hf(input_ids=torch.tensor([ids])).logits[0, -1].float()
            if p.temperature > 0:  # "processed_logprobs": after temperature
                logp = torch.log_softmax(logits / p.temperature, -1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
            else:
                logp = torch.log_softmax(logits, -1)
                tok = int(logits.argmax())
            toks.append(tok)
            lps.append({tok: Logprob(float(logp[tok]), rank=1)})
            ids.append(tok)
            if tok in (p.stop_token_ids or []):
                finish, stop_reason = "stop", tok
                break
        logprobs = None if (p.logprobs is None or self.drop_logprobs) else lps
        return CompletionOutput(0, "", toks, None, logprobs, finish, stop_reason)

    # -- memory and caches -----------------------------------------------------------------------
    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        self.events.append(("reset_prefix_cache",))
        return True

    def sleep(self, level: int = 1) -> None:
        assert self.kwargs["enable_sleep_mode"], "sleep mode was not enabled"
        self.reset_prefix_cache()
        self.events.append(("sleep", level))
        params = dict(self.engine_model.hf.named_parameters())
        with torch.no_grad():
            self._offloaded = {n: t.detach().clone() for n, t in params.items()} if level == 1 else {}
            for t in params.values():
                t.fill_(float("nan"))  # the device memory is gone either way
        self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.events.append(("wake_up", tuple(tags) if tags else None))
        tags = set(tags or ["weights", "kv_cache"])
        if "weights" in tags and "weights" in self.asleep:
            with torch.no_grad():
                for n, t in self.engine_model.hf.named_parameters():
                    if n in self._offloaded:
                        t.copy_(self._offloaded[n])
        self.asleep -= tags


def install(monkeypatch) -> types.ModuleType:
    """Install this module as `vllm` for the test."""
    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams = LLM, SamplingParams
    mod.TokensPrompt = dict
    monkeypatch.setitem(sys.modules, "vllm", mod)
    LLM.created.clear()
    return mod
