"""Forward passes and optimizer steps of one rank's part of a unit, any tp×pp (effectful).

The one entry point the RL step uses for inference and training on a unit: pp=1 and pp>1 go
through one schedule (:mod:`nereus.engines.pipeline`: our 1F1B on CPU ranks — at pp=1 forward
then backward per microbatch —, Megatron's on GPUs with a device communicator). Logits and losses
exist on the unit's last pipeline stage only; the vocab-sharded logits are gathered over the
unit's explicit tp group. Inference logits come back to the host (the batch-level math of the RL
step is on the host); training losses are computed where the logits are.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nereus.engines.pipeline import LossFn, StageLink, forward_backward, forward_logits, stage_link
from nereus.runtime.worker.state import UnitState


def link_of(state: UnitState) -> StageLink:
    staged = False
    if state.device is not None:
        _, tp_rank = state.position
        pp_ranks = [state.emu.gpu_at(p, tp_rank) for p in range(state.emu.layout.pp)]
        staged = state.device.staged(pp_ranks)
    return stage_link(state.emu, state.global_rank, state.groups.pp, state.spec.hidden_size,
                      staged)


def is_reporter(state: UnitState) -> bool:
    """Whether this rank reports its replica's results: the last pp stage's tp rank 0 (where
    the logits and losses are)."""
    pp_rank, tp_rank = state.position
    return pp_rank == state.emu.layout.pp - 1 and tp_rank == 0


def unit_logits(state: UnitState, tokens: torch.Tensor,
                valid: torch.Tensor | None = None) -> torch.Tensor | None:
    """Full-vocabulary logits [b, s, vocab] of ``tokens`` (eval mode, no grad; padded where
    ``valid`` is False) on the last pp stage, None on the other stages; every rank of the unit
    calls it with the same tokens."""
    state.model.eval()
    try:
        out = forward_logits(state.model, link_of(state), state.groups.tp, tokens, valid)
        return None if out is None else out.float().cpu()
    finally:
        state.model.train()


def unit_forward_backward(state: UnitState, microbatches: Sequence[torch.Tensor],
                          loss_fn: LossFn,
                          valid: Sequence[torch.Tensor | None] | None = None) -> float:
    """Accumulate the gradients of ``loss_fn`` over ``microbatches`` (padded where ``valid``
    is False); returns the summed loss on the last pp stage (0.0 elsewhere)."""
    return forward_backward(state.model, link_of(state), state.groups.tp, microbatches, loss_fn,
                            valid)

