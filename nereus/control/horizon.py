"""H_x: the expected number of steps until signal x crosses its threshold again.

An exponential moving average of the observed intervals (in steps) between crossings of x — for
the GPU pool, between changes — updated only at crossings. Before any interval has been observed
H_x is one step; the first observed interval replaces that prior, later ones are averaged in with
weight ``alpha``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

DEFAULT_HORIZON_STEPS = 1.0


@dataclass(frozen=True)
class SignalHorizon:
    last_crossing_step: int | None = None
    horizon_steps: float = DEFAULT_HORIZON_STEPS
    intervals_seen: int = 0

    def crossed(self, step: int, alpha: float) -> SignalHorizon:
        """The horizon after a crossing of this signal at ``step``."""
        if self.last_crossing_step is None:
            return replace(self, last_crossing_step=step)
        interval = float(step - self.last_crossing_step)
        if self.intervals_seen == 0:
            horizon = interval
        else:
            horizon = alpha * interval + (1.0 - alpha) * self.horizon_steps
        return SignalHorizon(step, max(horizon, 1.0), self.intervals_seen + 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "last_crossing_step": self.last_crossing_step,
            "horizon_steps": self.horizon_steps,
            "intervals_seen": self.intervals_seen,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SignalHorizon:
        last = d.get("last_crossing_step")
        return SignalHorizon(
            None if last is None else int(last),
            float(d["horizon_steps"]),
            int(d["intervals_seen"]),
        )
