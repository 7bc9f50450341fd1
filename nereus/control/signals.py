"""What the monitor observes at a step boundary, as plain data."""

from __future__ import annotations

from dataclasses import dataclass

# Names of the drifting signals and of the immediate ones.
GEN_LEN = "gen_len"  # mean generated tokens per response
POOL = "pool"  # the available GPU pool P_gpu
MEMORY = "memory"  # a predicted memory violation of the current plan
EFFICIENCY_PREFIX = "eff:"  # achieved efficiency of one op class, e.g. "eff:gemm"


@dataclass(frozen=True)
class Observation:
    """Signals measured over the step that just completed (or at a safe boundary).

    ``efficiencies`` are achieved efficiencies per op class (from calibration samples);
    ``transition_running`` is true while an earlier transition has not finished (async mode);
    ``memory_violation``: a device refused an allocation during the step (a measured memory
    violation: the replan is urgent whatever the memory model predicts).
    """

    step: int
    gen_len_mean: float
    gen_len_p95: float
    pool: tuple[int, ...]
    efficiencies: tuple[tuple[str, float], ...] = ()
    step_s: float = 0.0
    transition_running: bool = False
    memory_violation: bool = False

    def drifting_values(self) -> dict[str, float]:
        """The signals compared against their reference values with relative thresholds."""
        out = {GEN_LEN: float(self.gen_len_mean)}
        for op, eff in self.efficiencies:
            out[EFFICIENCY_PREFIX + op] = float(eff)
        return out
