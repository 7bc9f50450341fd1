"""The global sample order: which prompt every step and every DP replica sees.

Position ``p`` counts prompts consumed since the start of the run. Epoch ``e = p // N`` of a
dataset of ``N`` prompts is a permutation drawn from ``(seed, e)`` alone, so the order does not
depend on the plan: a replica with DP rank ``r`` of ``dp`` takes the contiguous slice ``r`` of the
step's global batch, and after any transition the new replicas derive their slices from their DP
rank and ``p`` — no sample is repeated or skipped.
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
    """The [start, stop) of the global batch that DP replica ``dp_rank`` of ``dp`` processes."""
    if dp <= 0 or not 0 <= dp_rank < dp:
        raise ValueError(f"dp_rank {dp_rank} outside dp {dp}")
    if global_batch % dp:
        raise ValueError(f"global batch {global_batch} not divisible by dp {dp}")
    per = global_batch // dp
    return dp_rank * per, (dp_rank + 1) * per
