"""Attention masks and positions of a padded batch (effectful: torch).

A batch of sequences of different lengths is left-padded (prompts end where the responses
begin); ``valid`` [b, s] is True on the real tokens. A padded row must give the logits of the
same row alone, so

- its pad tokens are masked out of every query's keys (and each pad query attends to itself
  only, so that no softmax row is empty: its output is never read);
- its positions count real tokens only (``cumsum(valid) - 1``), which learned absolute position
  embeddings read; rotary embeddings depend on the distance between a query and a key only, so
  a shift of every position by the padding leaves the attention unchanged.

Masks are Megatron's convention: boolean, True where a query must *not* attend, shaped
[b, 1, sq, sk] (:class:`nereus.engines.megatron_model.SdpaAttention` on the CPU; Megatron's
stock attention on a GPU takes the same tensor). A batch without padding gets no mask at all
(the causal kernel path).
"""

from __future__ import annotations

import torch


def positions_of(valid: torch.Tensor | None, b: int, s: int,
                 device: torch.device | None = None) -> torch.Tensor:
    """[b, s] position ids: 0..s-1, or counting real tokens only where ``valid`` is given."""
    if valid is None:
        return torch.arange(s, device=device).expand(b, s)
    return (valid.long().cumsum(dim=1) - 1).clamp_min(0).to(device)


def attention_mask(valid: torch.Tensor | None) -> torch.Tensor | None:
    """[b, 1, s, s] causal-and-padding mask of ``valid`` [b, s] (True: masked), or None when
    nothing is padded."""
    if valid is None or bool(valid.all()):
        return None
    valid = valid.bool()
    s = valid.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=valid.device).tril()
    allowed = causal & valid[:, None, None, :]
    allowed |= torch.eye(s, dtype=torch.bool, device=valid.device)  # pad rows: themselves
    return ~allowed


def decode_mask(valid_keys: torch.Tensor | None, queries: int = 1) -> torch.Tensor | None:
    """[b, 1, queries, sk] mask of the last ``queries`` positions of a KV-cache step against
    ``valid_keys`` [b, sk] (every key up to and including the new ones), None when nothing is
    padded."""
    if valid_keys is None or bool(valid_keys.all()):
        return None
    valid_keys = valid_keys.bool()
    sk = valid_keys.shape[1]
    causal = torch.ones(queries, sk, dtype=torch.bool,
                        device=valid_keys.device).tril(diagonal=sk - queries)
    return ~(causal & valid_keys[:, None, None, :])


def full_valid(prompt_valid: torch.Tensor | None, width: int) -> torch.Tensor | None:
    """[b, P + width] validity of prompts followed by ``width`` response tokens (a response's
    padding after its EOS comes after every token that is read, so it needs no mask)."""
    if prompt_valid is None:
        return None
    ones = torch.ones(prompt_valid.shape[0], width, dtype=torch.bool,
                      device=prompt_valid.device)
    return torch.cat([prompt_valid.bool(), ones], dim=1)
