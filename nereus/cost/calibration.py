"""Calibration store: efficiency per (hardware, op class) and memory factor per model-stage.

Efficiencies are fractions of the hardware's peak (FLOP/s for compute classes, bytes/s of the link
or HBM for the others). A measured sample of an operation whose ideal time (its work at 100% of
peak) is ``ideal_s`` and which took ``measured_s`` gives the sample efficiency
``ideal_s / measured_s``; the store keeps an exponential moving average of those samples, starting
from the hardware's default (``nereus.cost.defaults``) or ``CONSERVATIVE_EFFICIENCY`` for classes
never seen. Memory factors are the EMA of measured / predicted peak bytes of a model-stage, 1.0
until measured. Fixed costs are seconds per event that no bandwidth explains — a layer pass or a
decoded token on a device whose kernels are launch-bound, a communicator set up, a unit built
in a transition (:mod:`nereus.cost.overhead`); they start from the hardware's defaults
(``nereus.cost.defaults``) and are refitted with the efficiencies from measured times
(:mod:`nereus.cost.fit`). The store is a frozen value: every update returns a new one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from nereus.cost.defaults import DEFAULT_EFFICIENCIES, default_fixed_s
from nereus.errors import ConfigError
from nereus.spec.hardware import CONSERVATIVE_EFFICIENCY, GpuSpec, OpClass

# Efficiencies are clamped into [MIN_EFFICIENCY, 1]: a noisy sample faster than peak cannot make
# the model predict faster than the hardware allows, and a stalled one cannot make it divide by 0.
MIN_EFFICIENCY = 1e-4
MAX_EFFICIENCY = 1.0
# Memory factors are clamped into [MIN_MEMORY_FACTOR, MAX_MEMORY_FACTOR].
MIN_MEMORY_FACTOR = 0.1
MAX_MEMORY_FACTOR = 10.0

_OP_VALUES = frozenset(op.value for op in OpClass)


def _check_positive(field: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, value, "must be a number")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(field, value, "must be a finite number > 0")
    return float(value)


def _check_alpha(alpha: float) -> float:
    a = _check_positive("alpha", alpha)
    if a > 1.0:
        raise ConfigError("alpha", alpha, "EMA weight must be in (0, 1]")
    return a


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(hi, max(lo, x))


@dataclass(frozen=True)
class Calibration:
    """Efficiency per (hardware name, OpClass) and memory factor per model-stage name.

    Entries are kept sorted, so two stores with the same content are equal and serialize to the
    same bytes.
    """

    efficiencies: tuple[tuple[str, str, float], ...] = ()  # (gpu name, op class value, eff)
    memory_factors: tuple[tuple[str, float], ...] = ()  # (model-stage name, measured/predicted)
    fixed_costs: tuple[tuple[str, str, float], ...] = ()  # (gpu name, event key, seconds)

    def efficiency(self, gpu: GpuSpec, op: OpClass) -> float:
        """Calibrated efficiency, else the hardware default, else ``CONSERVATIVE_EFFICIENCY``."""
        key = OpClass(op).value
        for name, op_value, eff in self.efficiencies:
            if name == gpu.name and op_value == key:
                return eff
        return DEFAULT_EFFICIENCIES.get(gpu.name, {}).get(key, CONSERVATIVE_EFFICIENCY)

    def measured_efficiency(self, gpu: GpuSpec, op: OpClass, default: float) -> float:
        """The calibrated efficiency of ``op`` on ``gpu`` if one was measured, else ``default``
        (not the hardware's assumed figure: for models that assume nominal rates until told)."""
        key = OpClass(op).value
        for name, op_value, eff in self.efficiencies:
            if name == gpu.name and op_value == key:
                return eff
        return default

    def fixed_s(self, gpu: GpuSpec, key: str) -> float:
        """Calibrated seconds of one fixed-cost event ``key``, else the hardware default."""
        for name, k, v in self.fixed_costs:
            if name == gpu.name and k == key:
                return v
        return default_fixed_s(gpu, key)

    def with_fit(self, gpu: GpuSpec, efficiency: Mapping[str, float],
                 fixed_s: Mapping[str, float]) -> Calibration:
        """The store with ``efficiency`` (op class value → fraction of peak) and ``fixed_s``
        (event key → seconds) set for ``gpu`` (a fit's result: :func:`nereus.cost.fit.fit`)."""
        effs = {(n, k): v for n, k, v in self.efficiencies}
        for op_value, e in efficiency.items():
            effs[(gpu.name, OpClass(op_value).value)] = _clamp(float(e), MIN_EFFICIENCY,
                                                               MAX_EFFICIENCY)
        fixed = {(n, k): v for n, k, v in self.fixed_costs}
        for key, v in fixed_s.items():
            fixed[(gpu.name, str(key))] = max(0.0, float(v))
        return replace(self, efficiencies=tuple(sorted((n, k, v) for (n, k), v in effs.items())),
                       fixed_costs=tuple(sorted((n, k, v) for (n, k), v in fixed.items())))

    def memory_factor(self, model_stage: str) -> float:
        """Measured / predicted peak memory of ``model_stage``; 1.0 if never measured."""
        for name, factor in self.memory_factors:
            if name == model_stage:
                return factor
        return 1.0

    def with_time_sample(
        self, gpu: GpuSpec, op: OpClass, ideal_s: float, measured_s: float, alpha: float
    ) -> Calibration:
        """Blend the sample efficiency ``ideal_s / measured_s`` into the EMA with weight ``alpha``."""
        ideal = _check_positive("ideal_s", ideal_s)
        measured = _check_positive("measured_s", measured_s)
        a = _check_alpha(alpha)
        key = OpClass(op).value
        sample = _clamp(ideal / measured, MIN_EFFICIENCY, MAX_EFFICIENCY)
        new = _clamp((1.0 - a) * self.efficiency(gpu, op) + a * sample, MIN_EFFICIENCY, MAX_EFFICIENCY)
        rest = [e for e in self.efficiencies if not (e[0] == gpu.name and e[1] == key)]
        return replace(self, efficiencies=tuple(sorted([*rest, (gpu.name, key, new)])))

    def with_memory_sample(
        self, model_stage: str, predicted_bytes: float, measured_bytes: float, alpha: float
    ) -> Calibration:
        """Blend ``measured_bytes / predicted_bytes`` into the memory factor of ``model_stage``.

        ``predicted_bytes`` is the model's prediction *before* the factor is applied.
        """
        predicted = _check_positive("predicted_bytes", predicted_bytes)
        measured = _check_positive("measured_bytes", measured_bytes)
        a = _check_alpha(alpha)
        sample = _clamp(measured / predicted, MIN_MEMORY_FACTOR, MAX_MEMORY_FACTOR)
        new = _clamp(
            (1.0 - a) * self.memory_factor(model_stage) + a * sample,
            MIN_MEMORY_FACTOR,
            MAX_MEMORY_FACTOR,
        )
        rest = [m for m in self.memory_factors if m[0] != model_stage]
        return replace(self, memory_factors=tuple(sorted([*rest, (model_stage, new)])))

    def to_dict(self) -> dict[str, Any]:
        """``{"efficiencies": {gpu: {op: eff}}, "memory_factors": {model_stage: factor},
        "fixed_costs": {gpu: {event: seconds}}}`` (the last only when any is set)."""
        eff: dict[str, dict[str, float]] = {}
        for name, op_value, e in self.efficiencies:
            eff.setdefault(name, {})[op_value] = e
        out: dict[str, Any] = {"efficiencies": eff, "memory_factors": dict(self.memory_factors)}
        if self.fixed_costs:
            fixed: dict[str, dict[str, float]] = {}
            for name, key, v in self.fixed_costs:
                fixed.setdefault(name, {})[key] = v
            out["fixed_costs"] = fixed
        return out

    @staticmethod
    def from_dict(d: Any) -> Calibration:
        """Inverse of ``to_dict``; raises ``ConfigError`` naming the first bad entry."""
        if not isinstance(d, dict):
            raise ConfigError("calibration", d, "must be a mapping")
        unknown = set(d) - {"efficiencies", "memory_factors", "fixed_costs"}
        if unknown:
            key = sorted(str(k) for k in unknown)[0]
            raise ConfigError(f"calibration.{key}", d.get(key, key), "unknown key")
        effs = d.get("efficiencies", {})
        if not isinstance(effs, dict):
            raise ConfigError("calibration.efficiencies", effs, "must be a mapping gpu -> {op: eff}")
        entries: list[tuple[str, str, float]] = []
        for name, per_op in effs.items():
            field = f"calibration.efficiencies.{name}"
            if not isinstance(name, str) or not name:
                raise ConfigError(field, name, "hardware name must be a non-empty string")
            if not isinstance(per_op, dict):
                raise ConfigError(field, per_op, "must be a mapping op class -> efficiency")
            for op_value, e in per_op.items():
                if op_value not in _OP_VALUES:
                    raise ConfigError(f"{field}.{op_value}", op_value, f"op class not in {sorted(_OP_VALUES)}")
                v = _check_positive(f"{field}.{op_value}", e)
                if v > MAX_EFFICIENCY:
                    raise ConfigError(f"{field}.{op_value}", e, "efficiency must be in (0, 1]")
                entries.append((name, op_value, v))
        mems = d.get("memory_factors", {})
        if not isinstance(mems, dict):
            raise ConfigError("calibration.memory_factors", mems, "must be a mapping stage -> factor")
        factors: list[tuple[str, float]] = []
        for name, f in mems.items():
            field = f"calibration.memory_factors.{name}"
            if not isinstance(name, str) or not name:
                raise ConfigError(field, name, "model-stage name must be a non-empty string")
            factors.append((name, _check_positive(field, f)))
        fixed_d = d.get("fixed_costs", {})
        if not isinstance(fixed_d, dict):
            raise ConfigError("calibration.fixed_costs", fixed_d,
                              "must be a mapping gpu -> {event: seconds}")
        fixed: list[tuple[str, str, float]] = []
        for name, per_key in fixed_d.items():
            field = f"calibration.fixed_costs.{name}"
            if not isinstance(name, str) or not name or not isinstance(per_key, dict):
                raise ConfigError(field, per_key, "must be a mapping event -> seconds")
            for key, v in per_key.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                        not math.isfinite(v) or v < 0:
                    raise ConfigError(f"{field}.{key}", v, "must be a finite number >= 0")
                fixed.append((name, str(key), float(v)))
        return Calibration(tuple(sorted(entries)), tuple(sorted(factors)), tuple(sorted(fixed)))


def default_calibration() -> Calibration:
    """An empty store: every lookup answers the hardware default or the conservative value."""
    return Calibration()
