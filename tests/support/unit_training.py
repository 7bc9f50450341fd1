"""A supervised training step on one rank's part of a unit: the tests' probe that a unit still
trains — and trains like a unit built directly — after a plan change moved its tensors.

The runtime's RL step trains through :func:`nereus.runtime.worker.train.unit_forward_backward`
with the RL losses; this is the same call with next-token cross entropy, and an Adam step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nereus.runtime.worker.state import UnitState
from nereus.runtime.worker.train import unit_forward_backward


def train_step(state: UnitState, tokens: torch.Tensor, labels: torch.Tensor,
               micro_batch: int | None = None) -> float:
    """Next-token cross entropy (mean over all tokens of the batch), backward through the
    pipeline in microbatches of ``micro_batch`` rows (default: one), Adam step. Returns the loss
    on the last pp stage, 0.0 on the others."""
    opt = state.optimizer
    opt.zero_grad(set_to_none=True)
    rows = tokens.shape[0]
    mb = micro_batch or rows
    starts = list(range(0, rows, mb))
    n_tok = float(labels.numel())

    def loss_of(i: int, logits: torch.Tensor) -> torch.Tensor:
        a = starts[i]
        lab = labels[a:a + mb]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), lab.reshape(-1),
                               reduction="sum") / n_tok

    loss = unit_forward_backward(state, [tokens[a:a + mb] for a in starts], loss_of)
    opt.step()
    state.counters.updates += 1
    state.counters.position += 1
    return loss
