"""transformers backend: batched sampling with a KV cache, on CPU or CUDA.

Our own sampling loop (not `model.generate`) so that the logprob of each sampled token is
exactly the one under the distribution it was drawn from (logits / temperature), and so that
stopping is on token ids only. Requests of different lengths are left-padded into one batch.

Two samplers (config `transformers.sampler`): `loop` (this file: transformers' dynamic KV cache,
per-row torch generators; the default) and `static` (static_sampler.py: a fixed-size KV cache and
one compiled decoding step, for CUDA). The backend samples from the training model itself, or,
when that model is sharded (fsdp), from its own whole copy that `sync_weights` fills one gathered
parameter at a time.
"""

from __future__ import annotations

import asyncio
import threading

import torch
from transformers import DynamicCache

from tito.rollout.generation import FinishReason, GenRequest, GenResult


def sample_tokens(
    logits: torch.Tensor, temperatures: torch.Tensor,
    generator: torch.Generator | list[torch.Generator] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (tokens, logprob of each under its sampling distribution).

    generator: one for the batch, or one per row (then a row's draws do not depend on the others).
    temperature <= 0 means greedy; its logprob is then taken under the untempered distribution.

    Drawing is by the inverse CDF: one uniform per row, located in the row's cumulative
    probabilities. torch.multinomial over a 151k vocabulary took ~5 ms a row on CPU (95 ms of a
    16-row decoding step whose forward took 17); this takes ~3 ms for all 16. CPU cumsum accumulates
    float32 in double, so each boundary is off by float32 rounding only (~6e-8), and
    `right=True` never lands on a zero-probability token.
    """
    logits = logits.float()
    greedy = temperatures <= 0
    scaled = logits
    if bool((temperatures != 1).any()):  # a full pass over the vocabulary saved when all are 1
        scaled = logits / torch.where(greedy, torch.ones_like(temperatures), temperatures)[:, None]
    cdf = torch.softmax(scaled, dim=-1).cumsum(-1)
    if isinstance(generator, list):
        u = torch.stack([torch.rand((), generator=g, device=logits.device) for g in generator])
    else:
        u = torch.rand(logits.shape[0], generator=generator, device=logits.device)
    tokens = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)
    tokens = tokens.clamp(max=logits.shape[-1] - 1)
    if bool(greedy.any()):
        tokens = torch.where(greedy, logits.argmax(-1), tokens)
    logp = scaled.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    return tokens, logp


class TransformersBackend:
    def __init__(
        self,
        model,
        *,
        max_batch_size: int = 64,
        seed: int = 0,
        pad_token_id: int = 0,
        sampler: str = "loop",
        compile: bool = True,
        max_len: int = 1024,
        needs_sync: bool = False,
    ) -> None:
        """model: what to sample from (the training model itself, or a copy to keep in sync);
        needs_sync: its weights are not there yet (a copy made for a sharded policy), so generating
        before the first `sync_weights` is an error rather than samples from garbage."""
        if sampler not in ("loop", "static"):
            raise ValueError(f"unknown sampler {sampler!r} (use 'loop' or 'static')")
        self.model = model
        self.max_batch_size = max_batch_size
        self.pad_token_id = pad_token_id
        self.device = next(model.parameters()).device
        # CPU generator even for CUDA models would force syncs; keep it on the model's device.
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        # One generation at a time on the shared model (the rollout scheduler batches requests).
        self._lock = threading.Lock()
        self.tokens_generated = 0
        self._synced = not needs_sync
        self._static = None
        if sampler == "static":
            from trainer.backends.static_sampler import StaticCacheSampler

            self._static = StaticCacheSampler(model, max_len=max_len, max_batch_size=max_batch_size,
                                              pad_token_id=pad_token_id, compile=compile and self.device.type == "cuda")

    def sync_weights(self, model) -> None:
        """Sample from `model`'s weights from now on. The training model itself: nothing to copy.
        Another (a sharded policy): its tensors are gathered one at a time into this backend's copy,
        in this copy's dtype (every rank calls this together)."""
        if model is self.model:
            return
        from trainer.fsdp import full_tensors

        own = self.model.state_dict()
        dtype = next(self.model.parameters()).dtype
        with torch.no_grad():
            for name, tensor in full_tensors(model, dtype=dtype, device=self.device):
                own[name].copy_(tensor)
            own_buffers = dict(self.model.named_buffers())
            for name, buffer in model.named_buffers():  # not in the state dict (rotary frequencies)
                own_buffers[name].copy_(buffer)
        self._synced = True

    def release_memory(self) -> None:
        pass  # it shares the training model's memory

    def rng_state(self) -> torch.Tensor:
        """The shared generator's state (requests without their own seed draw from it)."""
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)

    async def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        # Off the event loop, so env calls of other rollouts proceed while we sample.
        return await asyncio.to_thread(self.generate_sync, requests)

    def generate_sync(self, requests: list[GenRequest]) -> list[GenResult]:
        if not self._synced:
            raise RuntimeError("this backend samples from its own copy of a sharded model and has no weights yet: "
                               "call sync_weights(model) first")
        out: list[GenResult] = []
        with self._lock:
            for i in range(0, len(requests), self.max_batch_size):
                batch = requests[i : i + self.max_batch_size]
                if self._static is not None:
                    out.extend(self._generate_static(batch))
                else:
                    out.extend(self._generate_batch(batch))
        return out

    def _generate_static(self, requests: list[GenRequest]) -> list[GenResult]:
        # Unseeded rows take a seed from the shared generator (checkpointed with it).
        seeds = [r.seed if r.seed is not None else
                 int(torch.randint(0, 2**62, (1,), generator=self.generator, device=self.device))
                 for r in requests]
        results = self._static.generate(requests, seeds)
        self.tokens_generated += sum(len(r.ids) for r in results)
        return results

    @torch.no_grad()
    def _generate_batch(self, requests: list[GenRequest]) -> list[GenResult]:
        for r in requests:
            if r.max_new < 1:
                raise ValueError(f"max_new must be >= 1, got {r.max_new}")
            if not r.prompt_ids:
                raise ValueError("empty prompt")
        dev = self.device
        model = self.model
        was_training = model.training
        model.eval()
        try:
            b = len(requests)
            width = max(len(r.prompt_ids) for r in requests)
            ids = torch.full((b, width), self.pad_token_id, dtype=torch.long, device=dev)
            attn = torch.zeros((b, width), dtype=torch.long, device=dev)
            for row, r in enumerate(requests):
                n = len(r.prompt_ids)
                ids[row, width - n :] = torch.tensor(r.prompt_ids, dtype=torch.long, device=dev)
                attn[row, width - n :] = 1
            pos = (attn.cumsum(-1) - 1).clamp(min=0)
            temps = torch.tensor([r.temperature for r in requests], dtype=torch.float, device=dev)
            max_stop = max(1, max(len(r.stop_token_ids) for r in requests))
            stops = torch.full((b, max_stop), -1, dtype=torch.long, device=dev)
            for row, r in enumerate(requests):
                if r.stop_token_ids:
                    stops[row, : len(r.stop_token_ids)] = torch.tensor(r.stop_token_ids, device=dev)
            max_new = torch.tensor([r.max_new for r in requests], device=dev)

            # Seeded requests draw from their own generator, unseeded ones from the shared one.
            gens: torch.Generator | list[torch.Generator] = self.generator
            if any(r.seed is not None for r in requests):
                gens = [self.generator if r.seed is None else
                        torch.Generator(device=dev).manual_seed(r.seed) for r in requests]
            cache = DynamicCache(config=model.config)
            logits = model(
                input_ids=ids, attention_mask=attn, position_ids=pos,
                past_key_values=cache, use_cache=True, logits_to_keep=1,
            ).logits[:, -1]
            gen_tokens: list[torch.Tensor] = []
            gen_logps: list[torch.Tensor] = []
            active = torch.ones(b, dtype=torch.bool, device=dev)
            lengths = torch.zeros(b, dtype=torch.long, device=dev)
            stopped = torch.zeros(b, dtype=torch.bool, device=dev)
            last_pos = pos[:, -1:]
            for _ in range(int(max_new.max())):
                tok, lp = sample_tokens(logits, temps, gens)
                tok = torch.where(active, tok, torch.full_like(tok, self.pad_token_id))
                gen_tokens.append(tok)
                gen_logps.append(lp)
                lengths += active.long()
                hit_stop = (tok[:, None] == stops).any(-1) & active
                stopped |= hit_stop
                active &= ~hit_stop & (lengths < max_new)
                if not bool(active.any()):
                    break
                attn = torch.cat([attn, torch.ones((b, 1), dtype=attn.dtype, device=dev)], dim=1)
                last_pos = last_pos + 1
                logits = model(
                    input_ids=tok[:, None], attention_mask=attn, position_ids=last_pos,
                    past_key_values=cache, use_cache=True,
                ).logits[:, -1]
            toks = torch.stack(gen_tokens, 1).cpu().tolist()
            lps = torch.stack(gen_logps, 1).cpu().tolist()
            lengths_l = lengths.cpu().tolist()
            stopped_l = stopped.cpu().tolist()
        finally:
            model.train(was_training)
        results = []
        for row in range(b):
            n = lengths_l[row]
            self.tokens_generated += n
            results.append(
                GenResult(
                    ids=toks[row][:n],
                    logprobs=lps[row][:n],
                    finish_reason=FinishReason.STOP if stopped_l[row] else FinishReason.LENGTH,
                )
            )
        return results
