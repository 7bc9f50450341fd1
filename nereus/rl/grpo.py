"""Critic-free PPO variants: GRPO (group-relative advantages) and ReMax (greedy baseline).

Both give one scalar advantage per sequence, applied to each of its response tokens; the policy
is kept near the reference with a k3 KL *loss* term (β·KL) instead of a KL-shaped reward. Loss
sums are normalized by the token count of the whole minibatch (see ``nereus.rl.ppo``).
"""

from __future__ import annotations

import torch

from nereus.rl.advantages import grpo_advantages, remax_advantages


def sequence_advantages(algorithm: str, scores: torch.Tensor, group_size: int,
                        greedy_scores: torch.Tensor | None = None) -> torch.Tensor:
    """[N] advantages: GRPO per prompt group (groups contiguous), ReMax against the greedy
    response of the same prompt (``greedy_scores`` per sequence)."""
    if algorithm == "grpo":
        return grpo_advantages(scores, group_size)
    if algorithm == "remax":
        if greedy_scores is None:
            raise ValueError("remax needs the greedy responses' scores")
        return remax_advantages(scores, greedy_scores)
    raise ValueError(f"no critic-free advantages for {algorithm!r}")


def kl_loss_sum(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ over response tokens of the k3 estimate exp(r − l) − (r − l) − 1 of KL(π‖π_ref)."""
    d = ref_logp - logp
    return ((torch.exp(d) - d - 1.0) * mask).sum()
