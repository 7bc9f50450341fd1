"""Textbook token-mean PPO-family losses: the oracle the runtime's loss sums are checked against.

The runtime (:mod:`nereus.rl.ppo`, :mod:`nereus.rl.grpo`) sums each loss over the response tokens
of a microbatch and divides by the minibatch's token count once, so that microbatches add up to
the minibatch's mean; these are the means written directly.
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp_min(1.0)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.2,
) -> torch.Tensor:
    """Clipped surrogate: −E[min(r·A, clip(r, 1−ε, 1+ε)·A)], r = exp(logp − old_logp)."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantages
    return -masked_mean(torch.minimum(unclipped, clipped), mask)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.2,
) -> torch.Tensor:
    """Clipped value loss: ½·E[max((v − R)², (clip(v, v_old ± ε) − R)²)]."""
    v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    loss = torch.maximum((values - returns) ** 2, (v_clipped - returns) ** 2)
    return 0.5 * masked_mean(loss, mask)


def kl_to_reference(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The k3 estimator of KL(π‖π_ref): E[exp(ref − logp) − (ref − logp) − 1] (non-negative)."""
    d = ref_logp - logp
    return masked_mean(torch.exp(d) - d - 1.0, mask)
