"""A supervised training step on one rank's part of a unit: the tests' probe that a unit still
trains — and trains like a unit built directly — after a plan change moved its tensors.

The runtime's RL step trains through :func:`nereus.runtime.worker.train.unit_forward_backward`
with the RL losses; this is the same call with next-token cross entropy, and an Adam step.
The labels may live anywhere (the caller's host tensors): each micro-batch's labels go to the
device of its logits (a unit on a GPU computes its logits there).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from nereus.runtime.worker.state import UnitState
from nereus.runtime.worker.train import unit_forward_backward


def token_loss(labels: torch.Tensor, starts: list[int], micro_batch: int
               ) -> Callable[[int, torch.Tensor], torch.Tensor]:
    """The loss of micro-batch ``i`` from its logits: next-token cross entropy summed over its
    tokens, divided by the tokens of the whole batch; computed on the logits' device."""
    n_tok = float(labels.numel())

    def loss_of(i: int, logits: torch.Tensor) -> torch.Tensor:
        a = starts[i]
        lab = labels[a:a + micro_batch].to(logits.device)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), lab.reshape(-1),
                               reduction="sum") / n_tok

    return loss_of


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
    loss = unit_forward_backward(state, [tokens[a:a + mb] for a in starts],
                                 token_loss(labels, starts, mb))
    opt.step()
    state.counters.updates += 1
    state.counters.position += 1
    return loss
