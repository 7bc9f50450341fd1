"""The hidden truth of a simulated cluster: what a step really takes, and what a profiler sees.

A truth answers the simulator's questions (:class:`Truth`): the measured time of every
model-stage of a placed plan in a step, the op-level samples a profiler would report, the real
time of a planned transition, and the calibration the oracle policy plans with. Three exist:

- :class:`HiddenTruth` (``--truth planner``): the planner's own cost model evaluated with
  *hidden* efficiencies and log-normal noise. Calibration can learn it exactly, so it cannot
  reveal an error of the model's form; kept as the easy reference.
- :class:`nereus.sim.shape_truth.ShapeTruth` (``--truth shape``, the default): a model of a
  different form (shape-dependent efficiency from the measured H200 op table, message-size
  dependent links, stragglers, longest-sequence decode rounds, noise).
- :class:`nereus.sim.replay.ReplayTruth` (``--truth replay:FILE``): measured stage times replayed
  where the plan matches a measurement (verl step logs, `nereus run` HDF5 logs), the shape truth
  scaled to those measurements elsewhere.

Deterministic for its seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from nereus.cost.calibration import Calibration
from nereus.cost.latency import stage_latency, step_latency_s
from nereus.spec.hardware import GpuSpec, OpClass
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan

# A reference operation per class for the profiler's samples: its ideal time at 100% of peak.
REFERENCE_IDEAL_S = 1e-3


def conservative_calibration(gpu_name: str, efficiency: float = 0.3) -> Calibration:
    """Every op class at a conservative ``efficiency``: where a run with no measurements starts."""
    return Calibration(tuple(sorted((gpu_name, op.value, efficiency) for op in OpClass)))


def hidden_calibration(base: Calibration, gpu: GpuSpec, seed: int, spread: float = 0.2) -> Calibration:
    """True efficiencies: the base (e.g. measured defaults) × a factor in [1−spread, 1+spread]."""
    rng = np.random.Generator(np.random.PCG64([seed, 17]))
    rows = []
    for op in OpClass:
        f = 1.0 + spread * (2.0 * float(rng.random()) - 1.0)
        rows.append((gpu.name, op.value, min(0.95, base.efficiency(gpu, op) * f)))
    return Calibration(tuple(sorted(rows)))


class Truth(Protocol):
    """What the simulator asks of a truth (module docstring)."""

    def step_s(self, setup: Setup, plan: ExecutionPlan, step: int) -> tuple[float, dict[str, float]]:
        """The step's critical path and the measured seconds of every model-stage."""
        ...

    def op_samples(self, gpu: GpuSpec, step: int) -> tuple[tuple[OpClass, float, float], ...]:
        ...

    def transition_s(self, predicted_s: float, step: int) -> float:
        ...

    def oracle_calibration(self, gpu: GpuSpec) -> Calibration:
        ...


@dataclass(frozen=True)
class HiddenTruth:
    calibration: Calibration
    noise_rel: float = 0.02
    seed: int = 0

    def _noise(self, step: int, salt: int) -> float:
        if self.noise_rel <= 0:
            return 1.0
        rng = np.random.Generator(np.random.PCG64([self.seed, step, salt]))
        return float(np.exp(rng.normal(0.0, self.noise_rel)))

    def stage_times_s(self, setup: Setup, plan: ExecutionPlan, step: int) -> dict[str, float]:
        wf = setup.job.workflow
        out = {}
        for i, sp in enumerate(plan.stages):
            true_s = stage_latency(setup, wf.by_name(sp.name), sp.candidate, self.calibration).total_s
            out[sp.name] = true_s * self._noise(step, 1000 + i)
        return out

    def step_s(self, setup: Setup, plan: ExecutionPlan, step: int) -> tuple[float, dict[str, float]]:
        times = self.stage_times_s(setup, plan, step)
        return step_latency_s(setup.job.workflow, times), times

    def op_samples(self, gpu: GpuSpec, step: int) -> tuple[tuple[OpClass, float, float], ...]:
        """(op class, ideal_s, measured_s) of one profiled reference operation per class."""
        out = []
        for j, op in enumerate(OpClass):
            eff = self.calibration.efficiency(gpu, op)
            out.append((op, REFERENCE_IDEAL_S, REFERENCE_IDEAL_S / eff * self._noise(step, j)))
        return tuple(out)

    def transition_s(self, predicted_s: float, step: int) -> float:
        return predicted_s * self._noise(step, 99)

    def oracle_calibration(self, gpu: GpuSpec) -> Calibration:
        return self.calibration
