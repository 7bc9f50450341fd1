"""Fitting the cost model's parameters to measured times (pure; DESIGN.md §3, "Calibration").

A measured time (a model-stage's step, a transition) is modelled as linear in the parameters:

    measured ≈ Σ_c ideal_c · x_c + Σ_k n_k · o_k

with ``ideal_c`` the time of op class ``c``'s work at 100% of peak, ``x_c = 1 / efficiency_c``
(≥ 1: nothing runs faster than peak) and ``n_k`` the count of fixed-cost events ``k`` (a layer
pass, a decoded token, a communicator set up, a unit built), each costing ``o_k ≥ 0`` seconds.
The parameters are refitted from a window of recent samples by non-negative least squares on the
*relative* errors (every sample counts alike, whatever its length), with a ridge prior pulling
each parameter towards its current value, so one sample moves the model part of the way and
parameters a window does not inform stay where they were.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# How strongly each parameter is held at its prior, against one sample's relative error.
PRIOR_WEIGHT = 0.3
# Scale of the prior for a fixed cost whose prior is 0 (a parameter never measured): seconds.
ZERO_PRIOR_SCALE_S = 1.0


@dataclass(frozen=True)
class Sample:
    """One measured time and its features: ``ideal`` seconds per op class at 100% of peak,
    ``counts`` of fixed-cost events, ``measured_s``."""

    ideal: tuple[tuple[str, float], ...]
    counts: tuple[tuple[str, float], ...]
    measured_s: float
    label: str = ""

    def predict_s(self, inverse_eff: Mapping[str, float], fixed_s: Mapping[str, float]) -> float:
        return (sum(v * inverse_eff.get(k, 1.0) for k, v in self.ideal)
                + sum(n * fixed_s.get(k, 0.0) for k, n in self.counts))

    def to_dict(self) -> dict[str, object]:
        return {"ideal": dict(self.ideal), "counts": dict(self.counts),
                "measured_s": self.measured_s, "label": self.label}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Sample:
        return Sample(tuple(sorted((str(k), float(v)) for k, v in d["ideal"].items())),
                      tuple(sorted((str(k), float(v)) for k, v in d["counts"].items())),
                      float(d["measured_s"]), str(d.get("label", "")))


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """argmin_x ||a x − b|| subject to x ≥ 0 (Lawson–Hanson active set)."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 1e-12 * max(1.0, float(np.abs(a).max(initial=0.0))) * max(m, n)
    for _ in range(max_iter):
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = float(np.min(x[neg] / np.maximum(x[neg] - z[neg], 1e-300)))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    return x


def fit(samples: Sequence[Sample], inverse_eff: Mapping[str, float], fixed_s: Mapping[str, float],
        prior_weight: float = PRIOR_WEIGHT) -> tuple[dict[str, float], dict[str, float]]:
    """Refit ``(inverse efficiencies, fixed costs)`` to ``samples``; both start from (and are
    pulled towards) the values given. Only parameters some sample exercises are returned."""
    classes = sorted({k for s in samples for k, v in s.ideal if v > 0})
    keys = sorted({k for s in samples for k, n in s.counts if n > 0})
    if not samples or not classes + keys:
        return {}, {}
    n_c, n = len(classes), len(classes) + len(keys)
    rows: list[np.ndarray] = []
    rhs: list[float] = []
    for s in samples:  # relative residual: (prediction − measured) / measured
        if not s.measured_s > 0:
            continue
        ideal, counts = dict(s.ideal), dict(s.counts)
        row = np.zeros(n)
        for i, c in enumerate(classes):
            row[i] = ideal.get(c, 0.0)  # unknown y_c = x_c − 1 ≥ 0
        for i, k in enumerate(keys):
            row[n_c + i] = counts.get(k, 0.0)
        base = sum(ideal.values())  # the work at peak, x_c = 1
        rows.append(row / s.measured_s)
        rhs.append((s.measured_s - base) / s.measured_s)
    for i, c in enumerate(classes):  # prior: y_c near its current value, relative to x_c
        cur = max(float(inverse_eff.get(c, 1.0)), 1.0)
        row = np.zeros(n)
        row[i] = prior_weight / cur
        rows.append(row)
        rhs.append(prior_weight * (cur - 1.0) / cur)
    for i, k in enumerate(keys):
        cur = max(float(fixed_s.get(k, 0.0)), 0.0)
        scale = cur if cur > 0 else ZERO_PRIOR_SCALE_S
        row = np.zeros(n)
        row[n_c + i] = prior_weight / scale
        rows.append(row)
        rhs.append(prior_weight * cur / scale)
    x = nnls(np.array(rows), np.array(rhs))
    return ({c: 1.0 + float(x[i]) for i, c in enumerate(classes)},
            {k: float(x[n_c + i]) for i, k in enumerate(keys)})
