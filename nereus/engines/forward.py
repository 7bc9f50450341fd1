"""What the inference and training model-stages read from a Megatron GPTModel's logits.

Logits come from the unit's last pipeline stage (:mod:`nereus.engines.pipeline`) as
full-vocabulary logits on every tp rank (the runtime's models have
:func:`nereus.engines.generation.enable_kv_cache` applied, which gathers the vocab shards). The critic and the reward model are GPTModels
of their own architecture whose output column 0 is read as the scalar head (value per position,
reward at the last token): the EMU shard maps of Megatron's GPTModel then cover their whole
state, so they move between layouts like any other unit.
"""

from __future__ import annotations

import torch

VALUE_COLUMN = 0


def logits_of(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """[b, s, vocab] logits of ``tokens`` [b, s] (learned absolute positions 0..s-1) of a
    single-stage (pp=1) model; units of any pp go through :mod:`nereus.runtime.worker.train`."""
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    out: torch.Tensor = model(tokens, positions, None)
    return out


def response_logp(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """[b, T] log-probabilities of the response tokens tokens[:, P:] under ``logits``."""
    pred = logits[:, prompt_len - 1:-1, :].double()
    lp = torch.log_softmax(pred, dim=-1)
    return lp.gather(-1, tokens[:, prompt_len:].unsqueeze(-1)).squeeze(-1)


def response_values(logits: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """[b, T] values: the scalar head read before each response token is produced."""
    return logits[:, prompt_len - 1:-1, VALUE_COLUMN].double()


def sequence_scores(logits: torch.Tensor, mask: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """[b] reward-model scores: the scalar head at the last response token."""
    last = (mask.sum(dim=1).long() - 1).clamp_min(0) + prompt_len
    return logits[torch.arange(logits.shape[0]), last, VALUE_COLUMN].double()
