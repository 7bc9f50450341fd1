"""A step's responses scored by ``reward.fn`` on the ranks, and the step's batch record for the
run log (which rows it took, every response's reward, a few responses as text).

Responses are decoded from their ids up to and including the first EOS (the mask covers them),
special tokens skipped (:class:`~nereus.rl.data.tokenizer.TextCodec`); sequence ``i`` answers
prompt ``i // samples_per_prompt`` of the step. Scoring is shared out over the ranks and agreed
(:mod:`nereus.rl.rewards.scoring`): a failing function ends the run on every rank in one line.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from nereus.rl.inputs import RunInputs
from nereus.rl.rewards.scoring import Scores


def response_text(data: RunInputs, resp: torch.Tensor, mask: torch.Tensor | None) -> str:
    """The text of one response: ``resp`` its ids after the prompt; ``mask`` 1 on its tokens
    (None: up to the first EOS)."""
    ids = (resp if mask is None else resp[mask > 0]).tolist()
    return data.codec.decode(data.codec.response_ids(ids))


def score_responses(data: RunInputs, rows: np.ndarray, tokens: torch.Tensor,
                    mask: torch.Tensor | None, p_len: int, samples_per_prompt: int, comm: Any,
                    step: int, tag: str = "rewards") -> Scores:
    """``reward.fn`` of every sequence of ``tokens`` [n, P+T] (collective over ``comm``)."""
    def item_of(i: int) -> Any:
        text = response_text(data, tokens[i, p_len:], None if mask is None else mask[i])
        return data.item(data.train, int(rows[i // samples_per_prompt]), text,
                         f"step {step + 1}, sequence {i}")

    return data.scorer.score(tokens.shape[0], item_of, comm, tag)


def batch_record(data: RunInputs, rows: np.ndarray, tokens: torch.Tensor, mask: torch.Tensor,
                 p_len: int, scores: torch.Tensor, rule: Scores | None, step: int,
                 global_batch: int, samples_per_prompt: int, log_samples: int, comm: Any
                 ) -> dict[str, Any]:
    """What rank 0 logs of the step's batch (``{}`` on the other ranks): the rows (their index
    in data.train), the sample order's position and epoch, every sequence's reward, the
    failures scored 0, and the first ``log_samples`` responses as text."""
    if comm is not None and comm.Get_rank() != 0:
        return {}
    position = step * global_batch
    source = [int(data.train.source[int(r)]) for r in rows]
    samples = []
    for i in range(min(log_samples, tokens.shape[0])):
        samples.append({"seq": i, "row": source[i // samples_per_prompt],
                        "reward": float(scores[i]),
                        "response": response_text(data, tokens[i, p_len:], mask[i])})
    return {"batch": {"rows": source, "position": position,
                      "epoch": data.order.epoch_of(position),
                      "rewards": [float(x) for x in scores],
                      "errors": 0 if rule is None else rule.errors,
                      "first_error": "" if rule is None else rule.first_error},
            "samples": samples}
