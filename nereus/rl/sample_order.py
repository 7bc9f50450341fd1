"""The global sample order: which prompt every step and every DP replica sees.

Position ``p`` counts prompts consumed since the start of the run. Epoch ``e = p // N`` of a
dataset of ``N`` prompts is a permutation drawn from ``(seed, e)`` alone, so the order does not
depend on the plan: a replica with DP rank ``r`` of ``dp`` takes the contiguous slice ``r`` of the
step's global batch, and after any transition the new replicas derive their slices from their DP
rank and ``p`` — no sample is repeated or skipped. Where ``dp`` does not divide the batch (uneven
DP, ``nereus.spec.job.PlanSpace.uneven_dp``) the first ``n mod dp`` replicas take ``⌈n/dp⌉``
sequences and the others ``⌊n/dp⌋``: the slices still tile the batch in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SampleOrder:
    dataset_size: int
    seed: int

    def __post_init__(self) -> None:
        if self.dataset_size <= 0:
            raise ValueError("dataset_size must be positive")

    def _epoch(self, epoch: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
        return rng.permutation(self.dataset_size)

    def indices(self, start: int, count: int) -> np.ndarray:
        """Dataset indices of global positions ``start .. start+count-1``."""
        out = np.empty(count, dtype=np.int64)
        pos = start
        filled = 0
        while filled < count:
            epoch, offset = divmod(pos, self.dataset_size)
            take = min(count - filled, self.dataset_size - offset)
            out[filled : filled + take] = self._epoch(epoch)[offset : offset + take]
            filled += take
            pos += take
        return out


def replica_slice(global_batch: int, dp: int, dp_rank: int) -> tuple[int, int]:
    """The [start, stop) of the global batch that DP replica ``dp_rank`` of ``dp`` processes:
    ``⌈n/dp⌉`` sequences for the first ``n mod dp`` replicas, ``⌊n/dp⌋`` for the rest, in DP
    rank order (the planner's uneven DP: the largest share sets a candidate's time and memory)."""
    if dp <= 0 or not 0 <= dp_rank < dp:
        raise ValueError(f"dp_rank {dp_rank} outside dp {dp}")
    if dp > global_batch:
        raise ValueError(f"dp {dp} exceeds the {global_batch} sequences: a replica would be idle")
    per, extra = divmod(global_batch, dp)
    start = dp_rank * per + min(dp_rank, extra)
    return start, start + per + (1 if dp_rank < extra else 0)
