"""GRPO math: group-normalized advantages and the clipped policy-ratio loss over mask-1 tokens.

Shapes: per-token tensors are [B, T] over the *target* positions of a right-padded batch
(token t's logprob comes from the logits at t-1); `mask` is 1 exactly where the policy
generated the target token. Pads, prompt and environment tokens carry mask 0 and contribute
nothing, whatever value sits there (NaN placeholders are zeroed before any arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

LossNorm = Literal["sequence", "token"]


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor, *, scale_by_std: bool = True,
                     eps: float = 1e-4) -> torch.Tensor:
    """A_i = (r_i - mean_g) / (std_g + eps) within each group g (std with Bessel's correction,
    as TRL does); without std scaling A_i = r_i - mean_g. A group of one has advantage 0."""
    rewards = rewards.double()
    adv = torch.zeros_like(rewards)
    for g in torch.unique(groups):
        idx = groups == g
        r = rewards[idx]
        if r.numel() < 2:
            continue
        centered = r - r.mean()
        std = r.std(unbiased=True)
        # Equal rewards: centered is all zeros; do not divide 0 by 0 when eps is 0.
        adv[idx] = centered / (std + eps) if scale_by_std and std > 0 else centered
    return adv.float()


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate k3 = exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


@dataclass(frozen=True)
class LossConfig:
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    beta: float = 0.0  # KL coefficient; 0 disables the reference model
    norm: LossNorm = "sequence"


def per_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                   cfg: LossConfig, ref_logp: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-min(ratio * A, clip(ratio) * A) (+ beta * k3); advantages is [B] (one per sequence)."""
    ratio = torch.exp(logp - old_logp)
    a = advantages[:, None]
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1 - cfg.clip_eps_low, 1 + cfg.clip_eps_high) * a
    loss = -torch.minimum(unclipped, clipped)
    parts = {"ratio": ratio, "clipped": (clipped < unclipped).float()}
    if cfg.beta and ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
        loss = loss + cfg.beta * kl
        parts["kl"] = kl
    return loss, parts


def aggregate(loss_tok: torch.Tensor, mask: torch.Tensor, norm: LossNorm, *,
              total_sequences: int | None = None, total_tokens: int | None = None) -> torch.Tensor:
    """Reduce per-token loss over mask-1 positions.

    "sequence": mean over each sequence's tokens, then mean over sequences (GRPO paper).
    "token":    sum over all tokens / number of tokens in the whole batch (DAPO-style).
    total_*: the normalizers of the *whole* batch when this call sees one micro-batch, so that
    gradients accumulated over micro-batches equal those of one big batch.
    """
    m = mask.to(loss_tok.dtype)
    loss_tok = torch.where(mask.bool(), loss_tok, torch.zeros_like(loss_tok))  # kill NaN pads
    if norm == "sequence":
        per_seq = (loss_tok * m).sum(-1) / m.sum(-1).clamp(min=1)
        n = total_sequences if total_sequences is not None else loss_tok.shape[0]
        return per_seq.sum() / max(n, 1)
    if norm == "token":
        n = total_tokens if total_tokens is not None else int(m.sum())
        return (loss_tok * m).sum() / max(n, 1)
    raise ValueError(f"unknown loss normalization {norm!r} (use 'sequence' or 'token')")


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, cfg: LossConfig, ref_logp: torch.Tensor | None = None, *,
              total_sequences: int | None = None, total_tokens: int | None = None
              ) -> tuple[torch.Tensor, dict[str, float]]:
    mb = mask.bool()
    # Placeholders (NaN) at mask-0 positions must not poison exp()/gradients: replace first.
    old_logp = torch.where(mb, old_logp, logp.detach())
    if ref_logp is not None:
        ref_logp = torch.where(mb, ref_logp, logp.detach())
    loss_tok, parts = per_token_loss(logp, old_logp, advantages, cfg, ref_logp)
    loss = aggregate(loss_tok, mask, cfg.norm, total_sequences=total_sequences,
                     total_tokens=total_tokens)
    n = mb.sum().clamp(min=1)
    stats = {
        "clip_frac": float((parts["clipped"] * mb).sum() / n),
        "ratio_mean": float((parts["ratio"].detach() * mb).sum() / n),
    }
    if "kl" in parts:
        stats["kl"] = float((parts["kl"].detach() * mb).sum() / n)
    return loss, stats
