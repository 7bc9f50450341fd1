"""Advantage estimators: GAE (PPO), group-relative (GRPO), greedy baseline (ReMax)."""

from __future__ import annotations

import torch


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over response tokens.

    ``rewards``, ``values``, ``mask``: [batch, T] (mask 1 on response tokens). Returns
    (advantages, returns), zero outside the mask. Values past the last response token are 0.
    """
    batch, length = rewards.shape
    adv = torch.zeros_like(rewards)
    last = torch.zeros(batch, dtype=rewards.dtype, device=rewards.device)
    mask = mask.to(rewards.dtype)
    for t in range(length - 1, -1, -1):
        next_v = values[:, t + 1] * mask[:, t + 1] if t + 1 < length else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = (delta + gamma * lam * last * (mask[:, t + 1] if t + 1 < length else 0.0)) * mask[:, t]
        adv[:, t] = last
    returns = (adv + values) * mask
    return adv, returns


def grpo_advantages(scores: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages: (score − group mean) / (group std + eps) per prompt group.

    ``scores``: [num_prompts * group_size], groups contiguous.
    """
    if scores.numel() % group_size:
        raise ValueError("scores not divisible into groups")
    g = scores.view(-1, group_size)
    mean = g.mean(dim=1, keepdim=True)
    std = g.std(dim=1, keepdim=True, unbiased=False) if group_size > 1 else torch.zeros_like(mean)
    return ((g - mean) / (std + eps)).reshape(-1)


def remax_advantages(scores: torch.Tensor, greedy_scores: torch.Tensor) -> torch.Tensor:
    """ReMax: the sampled response's reward minus the greedy response's reward."""
    return scores - greedy_scores


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    m = mask.to(x.dtype)
    n = m.sum().clamp_min(1.0)
    mean = (x * m).sum() / n
    var = (((x - mean) * m) ** 2).sum() / n
    return (x - mean) * torch.rsqrt(var + eps) * m
