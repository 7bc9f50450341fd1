"""PPO over a generated batch: KL-shaped token rewards, GAE, clipped policy and value losses.

Batch-level quantities are computed identically on every rank from the gathered batch, so they
do not depend on the plan. Training losses are *sums* over a micro-batch's response tokens
divided by the token count of the whole optimizer minibatch: summing the gradients of all
micro-batches and DP replicas then equals the token-mean loss of the minibatch under any
(dp, micro-batch, accumulation) split, up to floating-point reduction order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nereus.rl.advantages import gae, masked_whiten


@dataclass(frozen=True)
class PpoBatch:
    advantages: torch.Tensor  # [N, T] whitened over the batch
    returns: torch.Tensor  # [N, T]
    kl: float  # mean per-token log-ratio to the reference (sampled estimate)


def token_rewards(scores: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor,
                  mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """−β·(log π − log π_ref) per response token, plus the sequence score at its last token."""
    r = -kl_coef * (logp - ref_logp) * mask
    last = (mask.sum(dim=1).long() - 1).clamp_min(0)
    r[torch.arange(r.shape[0]), last] += scores * (mask.sum(dim=1) > 0)
    return r


def ppo_batch(scores: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor,
              values: torch.Tensor, mask: torch.Tensor, kl_coef: float, lam: float) -> PpoBatch:
    r = token_rewards(scores, logp, ref_logp, mask, kl_coef)
    adv, ret = gae(r, values * mask, mask, gamma=1.0, lam=lam)
    n = mask.sum().clamp_min(1.0)
    kl = float(((logp - ref_logp) * mask).sum() / n)
    return PpoBatch(masked_whiten(adv, mask), ret, kl)


def policy_loss_sum(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                    mask: torch.Tensor, clip: float) -> torch.Tensor:
    """Σ over response tokens of the clipped surrogate loss (negated)."""
    ratio = torch.exp(logp - old_logp)
    surr = torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * adv)
    return -(surr * mask).sum()


def value_loss_sum(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                   mask: torch.Tensor, clip: float) -> torch.Tensor:
    """Σ over response tokens of ½·max((v − R)², (clip(v, v_old ± ε) − R)²)."""
    v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    loss = torch.maximum((values - returns) ** 2, (v_clipped - returns) ** 2)
    return 0.5 * (loss * mask).sum()
