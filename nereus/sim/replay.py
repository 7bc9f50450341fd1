"""A truth that replays measured stage times (``nereus simulate --truth replay:FILE``).

Measurements come from two sources:

- verl step logs (``shared/data/verl-logs/*.steps.csv``: per-step ``timing/gen``, ``timing/ref``,
  ``timing/values``, ``timing/update_critic``, ``timing/update_actor`` of a real PPO run on one
  GPU), mapped to actor-gen, ref-inf, critic-inf, critic-train and actor-train at tp = pp = dp = 1;
- `nereus run` HDF5 logs (``steps.stage_s`` per model-stage, the plan in force from the initial
  plan and the transitions table), keyed by each model-stage's (tp, pp, dp).

A model-stage whose layout in the simulated plan was measured takes the measured time of the
matching step (cycled when the simulation runs longer than the log); any other takes the shape
truth (:mod:`nereus.sim.shape_truth`) scaled by measured / shape-truth time of that model-stage
at its measured layout and lengths, so the replayed measurements anchor the extrapolation.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nereus.cost.calibration import Calibration
from nereus.cost.latency import step_latency_s
from nereus.errors import ConfigError
from nereus.sim.shape_truth import ShapeTruth
from nereus.sim.traces import LengthPoint, LengthTrace
from nereus.spec.hardware import GpuSpec, OpClass
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan, StagePlan

VERL_COLUMNS = {
    "timing/gen": "actor-gen",
    "timing/ref": "ref-inf",
    "timing/values": "critic-inf",
    "timing/update_critic": "critic-train",
    "timing/update_actor": "actor-train",
}

Key = tuple[str, int, int, int]  # model-stage, tp, pp, dp


@dataclass(frozen=True)
class Measured:
    """Measured seconds of one model-stage at one layout, step by step."""

    key: Key
    times_s: tuple[float, ...]
    gen_len: float  # mean generated tokens over those steps
    plan: StagePlan  # the measured layout (its batch split is re-derived for the job simulated)


@dataclass(frozen=True)
class ReplayTruth:
    measured: tuple[Measured, ...]
    fallback: ShapeTruth = field(default_factory=ShapeTruth)

    def _scale(self, setup: Setup, sp: StagePlan) -> float:
        """Measured / shape-truth seconds of ``sp``'s model-stage at its first measured layout
        (1 if none), both for this job's sequences at the measured mean length."""
        for m in self.measured:
            if m.key[0] != sp.name:
                continue
            ms = setup.job.workflow.by_name(sp.name)
            n = setup.job.sequences(ms.sequences_per_prompt) // (
                setup.job.minibatches if ms.trainable else 1)
            share = -(-n // m.plan.dp)
            b = sp.micro_batch if share % sp.micro_batch == 0 else 1
            at = replace(m.plan, micro_batch=b, grad_accum=share // b)
            mean = max(1, round(m.gen_len))
            s = replace(setup, job=replace(setup.job, gen_len=mean,
                                           gen_len_p95=max(mean, setup.job.gen_len_p95)))
            model_s = self.fallback.base_stage_s(s, at)
            return sum(m.times_s) / len(m.times_s) / model_s if model_s > 0 else 1.0
        return 1.0

    def stage_times_s(self, setup: Setup, plan: ExecutionPlan, step: int) -> dict[str, float]:
        by_key = {m.key: m for m in self.measured}
        model = self.fallback.stage_times_s(setup, plan, step)
        out: dict[str, float] = {}
        for sp in plan.stages:
            m = by_key.get((sp.name, sp.tp, sp.pp, sp.dp))
            if m is not None:
                out[sp.name] = m.times_s[step % len(m.times_s)]
            else:
                out[sp.name] = model[sp.name] * self._scale(setup, sp)
        return out

    def step_s(self, setup: Setup, plan: ExecutionPlan, step: int) -> tuple[float, dict[str, float]]:
        times = self.stage_times_s(setup, plan, step)
        return step_latency_s(setup.job.workflow, times), times

    def op_samples(self, gpu: GpuSpec, step: int) -> tuple[tuple[OpClass, float, float], ...]:
        return self.fallback.op_samples(gpu, step)

    def transition_s(self, predicted_s: float, step: int) -> float:
        return self.fallback.transition_s(predicted_s, step)

    def oracle_calibration(self, gpu: GpuSpec) -> Calibration:
        return self.fallback.oracle_calibration(gpu)


def _float(path: Path, line: int, col: str, text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ConfigError(f"{path}: line {line}", f"{col}={text!r}", "must be a number") from None
    if not (math.isfinite(v) and v > 0):
        raise ConfigError(f"{path}: line {line}", f"{col}={text!r}", "must be a number > 0")
    return v


def load_verl_steps(path: str | Path) -> tuple[tuple[Measured, ...], LengthTrace]:
    """Measured stage times (tp = pp = dp = 1) and the length trace of a verl step log."""
    p = Path(path)
    try:
        rows = list(csv.DictReader(p.read_text().splitlines()))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("--truth", str(p), f"must be a readable CSV file ({exc.__class__.__name__})") from None
    need = [*VERL_COLUMNS, "response_length/mean", "response_length/max"]
    if not rows or any(c not in rows[0] for c in need):
        missing = [c for c in need if not rows or c not in rows[0]]
        raise ConfigError(f"{p}: header", missing[0], "column missing (a verl step log needs it)")
    times: dict[str, list[float]] = {n: [] for n in VERL_COLUMNS.values()}
    points: list[LengthPoint] = []
    for i, r in enumerate(rows):
        line = i + 2
        for col, name in VERL_COLUMNS.items():
            times[name].append(_float(p, line, col, r[col]))
        mean = _float(p, line, "response_length/mean", r["response_length/mean"])
        top = _float(p, line, "response_length/max", r["response_length/max"])
        points.append(LengthPoint(i, mean, max(mean, top)))
    gen = sum(pt.mean for pt in points) / len(points)
    measured = tuple(
        Measured((name, 1, 1, 1), tuple(ts), gen, StagePlan(name, 1, 1, 1, 1, 1))
        for name, ts in times.items()
    )
    return measured, LengthTrace(tuple(points))


def load_run_log(path: str | Path) -> tuple[Measured, ...]:
    """Measured stage times of a `nereus run` HDF5 log, keyed by each model-stage's layout."""
    from nereus.log.reader import read_run_log

    log = read_run_log(str(path))
    plans: list[Any] = [log.initial_plan]
    trans = log.tables.get("transitions", {})
    plans += list(trans.get("plan", ()))
    steps = log.steps
    series: dict[Key, tuple[list[float], list[float], StagePlan]] = {}
    for i in range(log.rows("steps")):
        version = int(steps["plan_version"][i])
        if not 0 <= version < len(plans) or not isinstance(plans[version], dict):
            continue
        plan = ExecutionPlan.from_dict(plans[version])
        stage_s = steps["stage_s"][i]
        if not isinstance(stage_s, dict):
            continue
        for sp in plan.stages:
            t = stage_s.get(sp.name)
            if isinstance(t, (int, float)) and t > 0:
                key = (sp.name, sp.tp, sp.pp, sp.dp)
                ts, lens, _ = series.setdefault(key, ([], [], replace(sp, replicas=())))
                ts.append(float(t))
                lens.append(float(steps["gen_len_mean"][i]))
    if not series:
        raise ConfigError("--truth", str(path), "the run log has no measured stage times")
    return tuple(
        Measured(k, tuple(ts), sum(lens) / len(lens), sp) for k, (ts, lens, sp) in series.items()
    )
