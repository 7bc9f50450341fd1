"""One optimizer step of a unit held in a single pipeline stage (effectful).

CPU ranks run pp=1 units here; Megatron's pipeline schedules allocate on CUDA, and a CPU
microbatch schedule between stage models is not part of this module. The vocab-sharded logits
are gathered over the unit's explicit tp group (Megatron's own gather allocates on CUDA).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from nereus.errors import TransitionError
from nereus.runtime.state import UnitState


class _GatherLastDim(torch.autograd.Function):
    """All-gather along the last axis; backward keeps this rank's slice (the loss is replicated
    on every tp rank, as in Megatron's gather-from-model-parallel-region)."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        size = dist.get_world_size(group)
        ctx.rank, ctx.width = dist.get_rank(group), local.shape[-1]
        if size == 1:
            return local
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        lo = ctx.rank * ctx.width
        return grad[..., lo:lo + ctx.width].contiguous(), None


def train_step(state: UnitState, tokens: torch.Tensor, labels: torch.Tensor) -> float:
    """Forward, next-token cross entropy (mean over tokens), backward, Adam step; returns loss."""
    if state.emu.layout.pp != 1:
        raise TransitionError(f"train_step runs pp=1 units only, got {state.emu.layout}")
    model, opt = state.model, state.optimizer
    opt.zero_grad(set_to_none=True)
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    local_logits = model(tokens, positions, None)  # [b, s, vocab / tp]
    logits = _GatherLastDim.apply(local_logits, state.groups.tp)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
    loss.backward()
    opt.step()
    state.counters.updates += 1
    state.counters.position += 1
    return float(loss.detach())
