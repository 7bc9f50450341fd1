"""Gathering vocab-parallel logits over a unit's explicit tp group on CPU (effectful).

Megatron's own gather-from-tensor-parallel-region allocates its buffer on CUDA, so the CPU
engines gather with a gloo all-gather of their own.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class GatherLastDim(torch.autograd.Function):
    """All-gather along the last axis; backward keeps this rank's slice (the loss is replicated
    on every tp rank, as in Megatron's gather-from-model-parallel-region)."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        size = dist.get_world_size(group)
        ctx.rank, ctx.width = dist.get_rank(group), local.shape[-1]
        if size == 1:
            return local
        if local.device.type != "cpu" and dist.get_backend(group) == "gloo":
            host = local.detach().cpu().contiguous()  # a GPU unit on the host transport
            host_parts = [torch.empty_like(host) for _ in range(size)]
            dist.all_gather(host_parts, host, group=group)
            return torch.cat(host_parts, dim=-1).to(local.device)
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        lo = ctx.rank * ctx.width
        return grad[..., lo:lo + ctx.width].contiguous(), None


def full_vocab(model: torch.nn.Module, out: torch.Tensor, tp_group: dist.ProcessGroup
               ) -> torch.Tensor:
    """The last stage's output as full-vocabulary logits: models prepared by
    :func:`nereus.engines.generation.enable_kv_cache` already gather, others are gathered here."""
    if getattr(model, "_nereus_kv_ready", False):
        return out
    gathered: torch.Tensor = GatherLastDim.apply(out, tp_group)
    return gathered
