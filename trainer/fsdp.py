"""`distributed.strategy: fsdp`: the policy (and the KL reference) sharded with FSDP2.

Each decoder layer is one `torch.distributed.fsdp.fully_shard` unit, the root (embeddings, final
norm, LM head) another. Between the units' forward and backward passes FSDP all-gathers one layer
at a time and reduce-scatters its gradients, so a rank holds 1/world of the weights, gradients and
Adam state, plus about one layer unsharded. Mixed precision is FSDP's own (`MixedPrecisionPolicy`:
layers computed in `param_dtype`, gradients reduced in `reduce_dtype`, the sharded masters in
model.dtype); `cpu_offload` is its `CPUOffloadPolicy`.

Loading: rank 0 holds the whole model in host memory, the other ranks a skeleton on the meta
device (no memory); after sharding every rank takes its shard of rank 0's weights
(`set_model_state_dict(..., broadcast_from_rank0=True)`), and buffers that are not in the state
dict (rotary frequencies) are broadcast.

Gradients are summed over the ranks, not averaged (the loss already carries the whole batch's
normalisers): a gradient divide factor of 1 with plain sums (`set_force_sum_reduction_for_comms`;
gloo has no pre-multiplied sum).

The loss calls the base model and the LM head separately (only mask-1 positions reach the
vocabulary projection), which is not the root module's `forward`; the root unit's parameters would
then never be gathered. `target_logprobs` therefore runs as the model's `logprob_forward` method,
registered with `register_fsdp_forward_method`, so FSDP's hooks wrap it as they wrap `forward`.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import nn

log = logging.getLogger(__name__)

LOGPROB_FORWARD = "logprob_forward"  # the model method FSDP's hooks wrap (see the module docstring)


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The modules to shard one by one: transformers names its decoder layer classes in
    `_no_split_modules` (what accelerate and TRL wrap too)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layer class (_no_split_modules): "
                         "fsdp does not know what to shard; use distributed.strategy: replicate")
    return layers


def meta_skeleton(model: nn.Module) -> nn.Module:
    """An empty copy of `model`'s architecture on the meta device (no memory), in its dtype."""
    with torch.device("meta"):
        skeleton = type(model)._from_config(model.config, dtype=next(model.parameters()).dtype)
    return skeleton


def shard(model: nn.Module, *, device: torch.device, param_dtype: str, reduce_dtype: str,
          cpu_offload: bool, full_state: dict[str, torch.Tensor], full_buffers: dict[str, torch.Tensor]) -> nn.Module:
    """Shard `model` in place and load rank 0's weights into the shards. Every rank calls this:
    rank 0 with the whole model's `state_dict()` and `named_buffers()` (they may belong to another
    module of the same architecture), the others with empty dicts and a meta-device model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy,
                                        fully_shard, register_fsdp_forward_method)

    from trainer.model import target_logprobs_unsharded

    on_meta = any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    mesh = init_device_mesh(device.type, (torch_dist.get_world_size(),))
    settings: dict[str, Any] = dict(
        mesh=mesh,
        mp_policy=MixedPrecisionPolicy(param_dtype=getattr(torch, param_dtype), reduce_dtype=getattr(torch, reduce_dtype)),
        offload_policy=CPUOffloadPolicy() if cpu_offload else OffloadPolicy())
    for layer in decoder_layers(model):
        fully_shard(layer, **settings)
    fully_shard(model, **settings)
    for unit in model.modules():
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
    model.logprob_forward = types.MethodType(target_logprobs_unsharded, model)
    register_fsdp_forward_method(model, LOGPROB_FORWARD)

    if on_meta:
        # Shards where FSDP keeps them (host memory with cpu_offload), buffers where the layers compute.
        model.to_empty(device="cpu" if cpu_offload else device)
        for module in model.modules():
            for key, buffer in module._buffers.items():
                if buffer is not None and buffer.device != device:
                    module._buffers[key] = buffer.to(device)
    # A copy of the dict: the call replaces its values with this rank's shards.
    set_model_state_dict(model, dict(full_state),
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    with torch.no_grad():
        for name, buffer in model.named_buffers():  # not all in the state dict (rotary frequencies): rank 0's
            if name in full_buffers:
                buffer.copy_(full_buffers[name])
            torch_dist.broadcast(buffer, src=0)
    return model


def full_tensors(model: nn.Module, dtype: torch.dtype | None = None,
                 device: torch.device | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) of `model.state_dict()`, one at a time: a sharded parameter is
    all-gathered when its turn comes (every rank must iterate in step), cast to `dtype` before the
    gather (so bf16 crosses the wire, not the fp32 masters). A plain module's tensors pass through.
    Consumers should not keep more than they need: that is what keeps the peak at one parameter."""
    from torch.distributed.tensor import DTensor

    for name, tensor in model.state_dict().items():
        if isinstance(tensor, DTensor):
            local = tensor.to_local()
            if dtype is not None:
                local = local.to(dtype)
            if device is not None and local.device != device:
                local = local.to(device)  # offloaded shards gather on the GPU
            tensor = DTensor.from_local(local, tensor.device_mesh, tensor.placements, shape=tensor.shape,
                                        stride=tensor.stride(), run_check=False).full_tensor()
        elif dtype is not None:
            tensor = tensor.to(dtype)
        yield name, tensor.detach()


def grad_norm(model: nn.Module, max_norm: float) -> float:
    """Clip the gradients to `max_norm` (over every rank's shards) and return the norm before."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)
