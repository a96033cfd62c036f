"""A scripted policy: emits fixed token ids per turn (for end-to-end tests of the machinery).

A random tiny model never writes a tool call by itself, so the e2e tests script the assistant
turns. Encoding *scripted* text into ids is fine here: the invariant is that the trainer never
re-tokenizes model output or environment text, and these ids are the "model output".
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tito.rollout.generation import FinishReason, GenRequest, GenResult

Script = Callable[[GenRequest], list[int]]


class ScriptedBackend:
    def __init__(self, script: Script, *, model=None, temperature_for_logprobs: float = 1.0,
                 provide_logprobs: bool = True) -> None:
        """script(request) returns the full turn (stop token included, if it should stop).

        model: if given, logprobs are the model's teacher-forced logprobs of the scripted ids,
        so the loss can be computed on them; otherwise a constant -1.0.
        provide_logprobs=False simulates a backend that drops logprobs (rollout must abort).
        """
        self.script = script
        self.model = model
        self.temperature = temperature_for_logprobs
        self.provide_logprobs = provide_logprobs
        self.requests: list[GenRequest] = []

    def sync_weights(self, model) -> None:
        pass

    def release_memory(self) -> None:
        pass

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return [self._one(r) for r in requests]

    def _one(self, r: GenRequest) -> GenResult:
        self.requests.append(r)
        full = list(self.script(r))
        ids = full[: r.max_new]
        stop = set(r.stop_token_ids)
        # Stop at the first stop token, as a real sampler would.
        for i, t in enumerate(ids):
            if t in stop:
                ids = ids[: i + 1]
                break
        finish = FinishReason.STOP if ids and ids[-1] in stop else FinishReason.LENGTH
        if not self.provide_logprobs:
            return GenResult(ids=ids, logprobs=None, finish_reason=finish)
        if self.model is None:
            lps = [-1.0] * len(ids)
        else:
            lps = teacher_forced_logprobs(self.model, r.prompt_ids, ids, self.temperature)
        return GenResult(ids=ids, logprobs=lps, finish_reason=finish)


@torch.no_grad()
def teacher_forced_logprobs(model, prompt_ids: list[int], ids: list[int], temperature: float = 1.0
                            ) -> list[float]:
    if not ids:
        return []
    dev = next(model.parameters()).device
    x = torch.tensor([prompt_ids + ids], device=dev)
    logits = model(input_ids=x).logits[0, len(prompt_ids) - 1 : -1].float()
    if temperature > 0:
        logits = logits / temperature
    lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids, device=dev)[:, None])
    return lp.squeeze(-1).tolist()
