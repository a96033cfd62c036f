"""The transformers backend's fast sampler (config `transformers.sampler: static`), made for CUDA.

Why: the `loop` sampler runs transformers' modules op by op from Python; on a GPU a decoding step
of a 0.6B model is then ~76 ms of launch overhead for a few ms of work (docs/trainer.md). Here
every decoding step has the same shapes, so it can be one compiled graph replayed with CUDA graphs
(`torch.compile(mode="reduce-overhead")`), as transformers' own generate does with a static cache:

- one `transformers.StaticCache` of `max_batch_size` rows x `max_len` (the context budget)
  positions, allocated at the first call and kept for the run (it is the largest thing this
  sampler holds: rows x context x 2 x layers x kv_heads x head_dim elements);
- a batch is left-padded to its longest prompt and to `max_batch_size` rows (unused rows decode a
  pad token and are dropped); requests whose prompt plus `max_new` would not fit the cache together
  run in separate groups (each one alone always fits: the rollout budget guarantees it);
- the prompt goes through the model eagerly (its shape varies), then each step is the compiled
  `decode_step`: one token per row through the model, then the choice of the next token.

The choice is exact in the sense the trainer needs: the logprob recorded for a token is the
log-softmax of the very logits it was drawn from, at its row's temperature (temperature 0:
argmax, logprob untempered, as in the `loop` sampler). Drawing uses the Gumbel-max rule,
argmax(logp + Gumbel noise), which picks token j with probability p_j, with noise from a counter
hash of (the row's seed, the step, the token id): no generator state, so the step has no host
work to do, and a seeded row samples the same tokens whatever shares its batch. The noise has 24
bits of resolution (a uniform in (0, 1) from a 32-bit hash), like a float32 exponential; its
samples differ from the `loop` sampler's (which uses torch generators), not their distribution.

On CPU it runs the same code eagerly (tests check it against the training model's recompute).
"""

from __future__ import annotations

import torch

from tito.rollout.generation import FinishReason, GenRequest, GenResult

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (a murmur-style avalanche) on int64 tensors holding values below
    2**32; the products wrap in int64, and the mask keeps their low 32 bits, which is all we use."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def row_keys(seeds: list[int], device) -> torch.Tensor:
    """A 32-bit key per row from 63-bit seeds (both halves mixed in)."""
    lo = torch.tensor([s & _MASK32 for s in seeds], dtype=torch.int64, device=device)
    hi = torch.tensor([(s >> 32) & _MASK32 for s in seeds], dtype=torch.int64, device=device)
    return _mix32(lo ^ _mix32(hi ^ _GOLDEN))


def counter_uniform(keys: torch.Tensor, step: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, vocab] uniforms in (0, 1), a function of (key, step, token id) only."""
    row = _mix32(keys ^ _mix32((step.to(torch.int64) + _GOLDEN) & _MASK32))
    ids = torch.arange(vocab, dtype=torch.int64, device=keys.device)
    bits = _mix32(_mix32((row[:, None] + ids[None, :] * _GOLDEN) & _MASK32) ^ row[:, None])
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def choose_tokens(logits: torch.Tensor, temperatures: torch.Tensor, keys: torch.Tensor,
                  step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The next token of each row and its logprob under the distribution it was drawn from."""
    logits = logits.float()
    greedy = temperatures <= 0
    t = torch.where(greedy, torch.ones_like(temperatures), temperatures)
    logp = torch.log_softmax(logits / t[:, None], dim=-1)
    gumbel = -torch.log(-torch.log(counter_uniform(keys, step, logits.shape[-1])))
    tokens = torch.where(greedy, logits.argmax(-1), (logp + gumbel).argmax(-1))
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class StaticCacheSampler:
    """Sampling over one static KV cache, a compiled decoding step on CUDA (see the module docstring)."""

    def __init__(self, model, *, max_len: int, max_batch_size: int, pad_token_id: int, compile: bool) -> None:
        self.model = model
        self.max_len = max_len
        self.rows = max_batch_size
        self.pad_token_id = pad_token_id
        self.device = next(model.parameters()).device
        self._cache = None
        self._step = torch.compile(self.decode_step, mode="reduce-overhead", dynamic=False) if compile \
            else self.decode_step

    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor,
                    temperatures: torch.Tensor, keys: torch.Tensor, step: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row through the model (KV cache in place), then the next token's choice."""
        logits = self.model(input_ids=tokens[:, None], position_ids=positions[:, None], attention_mask=attention_mask,
                            past_key_values=self._cache, use_cache=True).logits[:, -1]
        return choose_tokens(logits, temperatures, keys, step)

    @torch.no_grad()
    def generate(self, requests: list[GenRequest], seeds: list[int]) -> list[GenResult]:
        """Requests in groups that fit the cache together, in the order given."""
        for r in requests:
            if r.max_new < 1:
                raise ValueError(f"max_new must be >= 1, got {r.max_new}")
            if not r.prompt_ids:
                raise ValueError("empty prompt")
            if len(r.prompt_ids) + r.max_new > self.max_len:
                raise ValueError(f"prompt ({len(r.prompt_ids)}) + max_new ({r.max_new}) exceeds the static cache's "
                                 f"{self.max_len} positions (budget.context)")
        results: dict[int, GenResult] = {}
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
        group: list[int] = []
        for i in order:
            widest = max(len(requests[j].prompt_ids) for j in [*group, i])
            longest = max(requests[j].max_new for j in [*group, i])
            if group and (len(group) == self.rows or widest + longest > self.max_len):
                results.update(zip(group, self._generate_group([requests[j] for j in group], [seeds[j] for j in group])))
                group = []
            group.append(i)
        if group:
            results.update(zip(group, self._generate_group([requests[j] for j in group], [seeds[j] for j in group])))
        return [results[i] for i in range(len(requests))]

    def _generate_group(self, requests: list[GenRequest], seeds: list[int]) -> list[GenResult]:
        from transformers import StaticCache

        model, dev, rows, n = self.model, self.device, self.rows, len(requests)
        if self._cache is None:
            self._cache = StaticCache(config=model.config, max_cache_len=self.max_len)
        else:
            self._cache.reset()
        was_training = model.training
        model.eval()
        try:
            width = max(len(r.prompt_ids) for r in requests)
            steps = max(r.max_new for r in requests)
            ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long, device=dev)
            # Whole-cache padding mask: prompt pads masked, every later position open (causality
            # hides what is not written yet), so it never changes during decoding.
            attn = torch.ones((rows, self.max_len), dtype=torch.long, device=dev)
            attn[:, :width] = 0
            attn[n:, width - 1] = 1  # unused rows: one pad token each, so no row is fully masked
            for row, r in enumerate(requests):
                ids[row, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, dtype=torch.long, device=dev)
                attn[row, width - len(r.prompt_ids):width] = 1
            positions = (attn[:, :width].cumsum(-1) - 1).clamp(min=0)
            temps = torch.zeros(rows, dtype=torch.float, device=dev)
            temps[:n] = torch.tensor([r.temperature for r in requests], dtype=torch.float, device=dev)
            keys = row_keys(seeds + [0] * (rows - n), dev)
            max_stop = max(1, max(len(r.stop_token_ids) for r in requests))
            stops = torch.full((rows, max_stop), -1, dtype=torch.long, device=dev)
            for row, r in enumerate(requests):
                if r.stop_token_ids:
                    stops[row, : len(r.stop_token_ids)] = torch.tensor(r.stop_token_ids, device=dev)
            max_new = torch.zeros(rows, dtype=torch.long, device=dev)
            max_new[:n] = torch.tensor([r.max_new for r in requests], device=dev)

            logits = model(input_ids=ids, attention_mask=attn[:, :width], position_ids=positions,
                           past_key_values=self._cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            step = torch.zeros((), dtype=torch.int64, device=dev)
            tok, lp = choose_tokens(logits, temps, keys, step)
            out_tok = torch.full((rows, steps), self.pad_token_id, dtype=torch.long, device=dev)
            out_lp = torch.zeros((rows, steps), dtype=torch.float, device=dev)
            active = max_new > 0
            lengths = torch.zeros(rows, dtype=torch.long, device=dev)
            stopped = torch.zeros(rows, dtype=torch.bool, device=dev)
            position = positions[:, -1]
            for t in range(steps):
                tok = torch.where(active, tok, torch.full_like(tok, self.pad_token_id))
                out_tok[:, t] = tok
                out_lp[:, t] = lp
                lengths += active.long()
                hit = (tok[:, None] == stops).any(-1) & active
                stopped |= hit
                active &= ~hit & (lengths < max_new)
                # The host waits for the device only every 8 steps (to stop early).
                if t + 1 == steps or (t % 8 == 7 and not bool(active.any())):
                    break
                position = position + 1
                step = step + 1
                tok, lp = self._step(tok, position, attn, temps, keys, step)
                tok, lp = tok.clone(), lp.clone()  # a CUDA graph's outputs are overwritten by its next replay
            toks = out_tok.cpu().tolist()
            lps = out_lp.cpu().tolist()
            lengths_l = lengths.cpu().tolist()
            stopped_l = stopped.cpu().tolist()
        finally:
            model.train(was_training)
        return [GenResult(ids=toks[row][: lengths_l[row]], logprobs=lps[row][: lengths_l[row]],
                          finish_reason=FinishReason.STOP if stopped_l[row] else FinishReason.LENGTH)
                for row in range(n)]
