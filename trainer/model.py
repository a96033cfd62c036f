"""Policy model construction and logprob recomputation for the loss."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from tito.rollout.state import Rollout

log = logging.getLogger(__name__)

TINY_RANDOM_QWEN3 = "tiny-random-qwen3"
# Qwen2/2.5/3 tokenizer: 151,643 BPE ranks + 26 special tokens (151643..151668).
QWEN_TOKENIZER_SIZE = 151_669


def build_tiny_qwen3(vocab_size: int = QWEN_TOKENIZER_SIZE, seed: int = 0, *, layers: int = 2,
                     hidden: int = 64, heads: int = 4, kv_heads: int = 2, intermediate: int = 128,
                     max_positions: int = 8192, head_dim: int | None = None):
    """A randomly initialised Qwen3 (~10M parameters, tied embeddings), same for the same seed.

    head_dim defaults to hidden // heads (16); vLLM's CPU attention needs one of
    `tito.rollout.vllm.CPU_HEAD_DIMS` (32 is the smallest), which widens q/o projections only."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim or hidden // heads,
        intermediate_size=intermediate, tie_word_embeddings=True,
        max_position_embeddings=max_positions, bos_token_id=None,
        eos_token_id=151645 if vocab_size > 151645 else None,
        pad_token_id=151643 if vocab_size > 151643 else None,
    )
    rng_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen3ForCausalLM(config)
    finally:
        torch.random.set_rng_state(rng_state)
    return model


def load_model(path: str, *, vocab_size: int, seed: int, device: str, dtype: str = "float32",
               head_dim: int | None = None):
    """The policy on `device`; on "meta" only its skeleton (no weights are read, no memory is
    taken: fsdp's ranks other than 0 get their shards from rank 0)."""
    if path == TINY_RANDOM_QWEN3:
        if device == "meta":
            with torch.device("meta"):
                model = build_tiny_qwen3(vocab_size=vocab_size, seed=seed, head_dim=head_dim)
        else:
            model = build_tiny_qwen3(vocab_size=vocab_size, seed=seed, head_dim=head_dim)
    else:
        from transformers import AutoConfig, AutoModelForCausalLM

        from tito_assets.models import resolve_model

        path = resolve_model(path)  # a fetched model's name (tito_assets.fetch_model) -> its folder
        if device == "meta":
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path, local_files_only=True),
                                                         dtype=getattr(torch, dtype))
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), local_files_only=True)
    model.to(device=device, dtype=getattr(torch, dtype))
    return model


def enable_activation_checkpointing(model) -> None:
    """Recompute each decoder layer in the backward pass (transformers' gradient checkpointing,
    applied per decoder layer, non-reentrant so it composes with FSDP's hooks). Only in training
    mode: sampling from the same model (eval mode) keeps its KV cache."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _selected_logprobs(lm_head, hidden: torch.Tensor, targets: torch.Tensor,
                       temperature: float) -> torch.Tensor:
    logits = lm_head(hidden).float()
    if temperature > 0:
        logits = logits / temperature
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)


def target_logprobs(model, input_ids: torch.Tensor, target_mask: torch.Tensor,
                    temperature: float = 1.0, chunk: int = 1024) -> torch.Tensor:
    """Logprob of each target token input_ids[:, t+1] where target_mask[:, t] is 1; 0 elsewhere.

    Only mask-1 positions go through the vocabulary projection, in chunks, checkpointed when there is more
    than one: with a 150k vocabulary the full [B, T, V] logits would not fit in memory.
    Logits are divided by the sampling temperature so the ratio compares like with like.
    A sharded model runs it as its FSDP-registered `logprob_forward` (trainer/fsdp.py says why).
    """
    sharded_entry = getattr(model, "logprob_forward", None)
    if sharded_entry is not None:
        return sharded_entry(input_ids, target_mask, temperature, chunk)
    return target_logprobs_unsharded(model, input_ids, target_mask, temperature, chunk)


def target_logprobs_unsharded(model, input_ids: torch.Tensor, target_mask: torch.Tensor,
                              temperature: float = 1.0, chunk: int = 1024) -> torch.Tensor:
    """`target_logprobs` itself (a plain model calls it directly)."""
    base = getattr(model, model.base_model_prefix)
    lm_head = model.get_output_embeddings()
    # (use_cache stays the config's: use_cache=False takes another attention-mask path, whose float
    # results differ in the last bit, and the demo's figures are kept bit for bit.)
    hidden = base(input_ids=input_ids).last_hidden_state[:, :-1]
    sel = target_mask.bool()
    h = hidden[sel]
    tgt = input_ids[:, 1:][sel]
    parts = []
    # One chunk's logits live until backward either way, so checkpointing a single chunk saves no memory and
    # costs a second vocabulary projection (~40 % of an SFT step of the demo); with several, only one is alive.
    recompute = torch.is_grad_enabled() and h.shape[0] > chunk
    for i in range(0, h.shape[0], chunk):
        hc, tc = h[i : i + chunk], tgt[i : i + chunk]
        if recompute:
            parts.append(checkpoint(_selected_logprobs, lm_head, hc, tc, temperature,
                                    use_reentrant=False))
        else:
            parts.append(_selected_logprobs(lm_head, hc, tc, temperature))
    flat = torch.cat(parts) if parts else h.new_zeros(0, dtype=torch.float)
    out = torch.zeros(target_mask.shape, dtype=torch.float, device=input_ids.device)
    return out.index_put((sel.nonzero(as_tuple=True)), flat)


@dataclass
class RolloutBatch:
    """Right-padded tensors for a list of rollouts, over target positions (length T-1)."""

    input_ids: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T-1] 1 where the target token was generated by the policy
    old_logp: torch.Tensor  # [B, T-1] sampler logprobs at mask-1, NaN elsewhere
    advantages: torch.Tensor  # [B]


def filler_batch(pad_id: int, device) -> RolloutBatch:
    """A micro-batch that trains on nothing: one two-token row whose one target carries advantage 0
    (the caller also scales its loss by 0). Under fsdp a rank with fewer micro-batches than the
    others runs these, so that every rank makes the same collective calls (train.py)."""
    return RolloutBatch(input_ids=torch.full((1, 2), pad_id, dtype=torch.long, device=device),
                        mask=torch.ones((1, 1), dtype=torch.long, device=device),
                        old_logp=torch.zeros((1, 1), device=device), advantages=torch.zeros(1, device=device))


def collate(rollouts: list[Rollout], advantages: torch.Tensor, pad_id: int, device) -> RolloutBatch:
    width = max(len(r.ids) for r in rollouts)
    b = len(rollouts)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    lp = torch.full((b, width), float("nan"))
    for i, r in enumerate(rollouts):
        r.check()  # misaligned state never reaches the loss
        n = len(r.ids)
        ids[i, :n] = torch.tensor(r.ids)
        mask[i, :n] = torch.tensor(r.mask)
        lp[i, :n] = torch.tensor(r.logprobs)
    return RolloutBatch(
        input_ids=ids.to(device), mask=mask[:, 1:].to(device), old_logp=lp[:, 1:].to(device),
        advantages=advantages.to(device),
    )


def freeze_parameters(model: torch.nn.Module, prefixes: list[str]) -> int:
    """Turns off the gradient of every parameter whose name is one of `prefixes` or lies below one; returns how
    many parameters (elements) stay trainable. A prefix that names no parameter is a mistake, said with the names
    there are."""
    named = dict(model.named_parameters(remove_duplicate=False))  # a tied lm_head is named too
    for prefix in prefixes:
        hit = [p for name, p in named.items() if name == prefix or name.startswith(prefix + ".")]
        if not hit:
            tops = sorted({".".join(name.split(".")[:2]) for name in named})
            raise ValueError(f"model.freeze: no parameter of {type(model).__name__} is {prefix!r} or lies below it; "
                             f"its parameters start with: {', '.join(tops[:12])}")
        for p in hit:
            p.requires_grad_(False)
    return sum(p.numel() for p in trainable(model))


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimizer steps (not `model.freeze`'s)."""
    return [p for p in model.parameters() if p.requires_grad]
