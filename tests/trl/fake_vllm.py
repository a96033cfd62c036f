"""A small stand-in for TRL 1.16's vLLM objects (vLLM cannot be installed here).

Same method signatures as the real ones TitoRollout calls: `LLM.generate(prompts, sampling_params,
use_tqdm)` returning RequestOutput-like objects, `VLLMClient.generate(...)` returning TRL's dict,
and the attributes of `trl.generation.vllm_generation.VLLMGeneration` it reads. The "model" is a
script: a sequence_bias table (the example's steering) read greedily, else a filler token. It
honours max_tokens and stop_token_ids as vLLM does (the stop token is kept in token_ids).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FILLER_LOGPROB = -2.0
SCRIPT_LOGPROB = -0.01


class SamplingParams:
    """Keeps the keyword arguments vllm.SamplingParams was given."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        for k, v in kwargs.items():
            setattr(self, k, v)


@dataclass
class Logprob:
    logprob: float
    rank: int = 1
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str
    stop_reason: int | None = None


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]


class Script:
    """The next token is the one a sequence_bias entry boosts after the current tail (longest wins)."""

    def __init__(self, bias: list[list], filler: int) -> None:
        self.table = {tuple(key[:-1]): key[-1] for key, _ in bias}
        self.longest = max((len(k) for k in self.table), default=0)
        self.filler = filler

    def sample(self, prompt: list[int], max_tokens: int, stops: set[int]) -> tuple[list[int], list[float], str]:
        ids: list[int] = []
        lps: list[float] = []
        while len(ids) < max_tokens:
            seq = prompt + ids
            token = next((self.table[tuple(seq[-n:])] for n in range(self.longest, 0, -1)
                          if tuple(seq[-n:]) in self.table), None)
            ids.append(self.filler if token is None else token)
            lps.append(FILLER_LOGPROB if token is None else SCRIPT_LOGPROB)
            if ids[-1] in stops:
                return ids, lps, "stop"
        return ids, lps, "length"


class FakeLLM:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.calls: list[list[SamplingParams]] = []
        self.sleeps: list[str] = []

    def wake_up(self, tags=None):
        self.sleeps.append(f"wake_up{tags}")

    def sleep(self, level=1):
        self.sleeps.append(f"sleep{level}")

    def generate(self, prompts, sampling_params=None, use_tqdm=True, lora_request=None, priority=None):
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        self.calls.append(params)
        out = []
        for prompt, p in zip(prompts, params, strict=True):
            ids, lps, finish = self.script.sample(list(prompt["prompt_token_ids"]), p.max_tokens, set(p.stop_token_ids))
            out.append(RequestOutput(prompt["prompt_token_ids"], [CompletionOutput(
                0, ids, [{t: Logprob(lp)} for t, lp in zip(ids, lps)], finish,
                ids[-1] if finish == "stop" else None)]))
        return out


class FakeVLLMClient:
    """`trl.generation.vllm_client.VLLMClient.generate`, answered from the script."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.calls: list[dict[str, Any]] = []

    def generate(self, prompts, features=None, n=1, repetition_penalty=1.0, temperature=1.0, top_p=1.0, top_k=0,
                 min_p=0.0, max_tokens=16, logprobs=0, structured_outputs_regex=None, generation_kwargs=None):
        self.calls.append({"prompts": prompts, "n": n, "temperature": temperature, "top_p": top_p, "top_k": top_k,
                           "min_p": min_p, "max_tokens": max_tokens, "logprobs": logprobs,
                           "generation_kwargs": generation_kwargs})
        stops = set((generation_kwargs or {}).get("stop_token_ids", []))
        samples = [self.script.sample(list(p), max_tokens, stops) for p in prompts]
        return {"prompt_ids": [list(p) for p in prompts], "completion_ids": [s[0] for s in samples],
                "logprobs": [[[lp] for lp in s[1]] for s in samples],
                "logprob_token_ids": [[[t] for t in s[0]] for s in samples]}


@dataclass
class FakeVLLMGeneration:
    """The attributes of VLLMGeneration that TitoRollout and GRPOTrainer read."""

    mode: str
    accelerator: Any
    llm: FakeLLM | None = None
    vllm_client: FakeVLLMClient | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    generation_kwargs: dict = field(default_factory=dict)
    tensor_parallel_size: int = 1
    enable_sleep_mode: bool = False
    weight_syncs: int = 0

    def sync_weights(self) -> None:
        self.weight_syncs += 1
