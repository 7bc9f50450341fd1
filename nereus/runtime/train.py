"""One optimizer step of a unit held in a single pipeline stage (effectful).

CPU ranks run pp=1 units here; Megatron's pipeline schedules allocate on CUDA, and a CPU
microbatch schedule between stage models is not part of this module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nereus.errors import TransitionError
from nereus.runtime.state import UnitState


def train_step(state: UnitState, tokens: torch.Tensor, labels: torch.Tensor) -> float:
    """Forward, next-token cross entropy (mean over tokens), backward, Adam step; returns loss."""
    if state.emu.layout.pp != 1:
        raise TransitionError(f"train_step runs pp=1 units only, got {state.emu.layout}")
    model, opt = state.model, state.optimizer
    opt.zero_grad(set_to_none=True)
    seq = tokens.shape[1]
    positions = torch.arange(seq).expand_as(tokens)
    logits = model(tokens, positions, None)  # [b, s, vocab] (gathered over tp)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
    loss.backward()
    opt.step()
    state.counters.updates += 1
    state.counters.position += 1
    return float(loss.detach())
