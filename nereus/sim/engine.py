"""The trace-driven simulator: the real controller, planner and DAG code over a virtual cluster.

Each simulated step: read the GPU pool at the current simulated wall-clock time from the GPU
trace and the generated length from the length trace; let the policy decide (and pay for) a
transition; run the step, whose true time comes from a truth (:mod:`nereus.sim.truth`); feed the
measured stage times (``samples="stages"``, what `nereus run` measures: each model-stage's time
blended into its op classes by ``nereus.cost.stage_calibration``) or a profiler's op-level
samples (``samples="ops"``) to calibration. When the pool is empty the job waits (``wait_s``,
not counted as step time).

Policies:
- ``nereus``: the controller of §2.1 (triggers, urgent/opportunistic admission with γ);
- ``dynarl``: DynaRL-style: replan at every step (no drift thresholds), admit any ΔL > 0;
- ``static``: the initial TP/PP of every model-stage kept, DP re-fitted to the pool whenever it
  changes or the plan stops fitting (verl/OpenRLHF with elastic DP);
- ``every-k``: switch to the planner's target every k steps;
- ``oracle``: the best plan for the true efficiencies at every step, transitions free.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from nereus.control.admission import Admission
from nereus.control.controller import ControllerState, controller_step
from nereus.control.planner_port import SearchPort, plan_step_s, setup_for
from nereus.control.signals import Observation
from nereus.cost.calibration import Calibration
from nereus.cost.latency import stage_latency
from nereus.cost.stage_calibration import stage_time_samples
from nereus.errors import ConfigError
from nereus.plan.candidates import CostCache
from nereus.sim.traces import GpuTrace, LengthTrace
from nereus.sim.truth import Truth
from nereus.spec.hardware import OpClass
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan
from nereus.transition.fallbacks import (  # noqa: F401  (re-exported for callers)
    RESTART_BASE_S,
    RESTART_STORAGE_GBPS,
    checkpoint_restart_s,
)

POLICIES = ("nereus", "static", "dynarl", "every-k", "oracle")
SAMPLES = ("stages", "ops")


@dataclass(frozen=True)
class SimConfig:
    steps: int
    policy: str = "nereus"
    gamma: float = 0.5
    every_k: int = 10
    seed: int = 0
    max_wait_s: float = 30 * 86400.0  # give up when the pool stays empty this long
    samples: str = "stages"  # what calibration learns from: measured stage times, or op samples

    def __post_init__(self) -> None:
        if self.samples not in SAMPLES:
            raise ConfigError("--samples", self.samples, f"must be one of {', '.join(SAMPLES)}")
        if self.policy not in POLICIES:
            raise ConfigError("--policy", self.policy, f"must be one of {', '.join(POLICIES)}")
        if self.steps <= 0:
            raise ConfigError("--steps", self.steps, "must be a positive integer")
        if self.gamma < 0:
            raise ConfigError("--gamma", self.gamma, "must be >= 0")
        if self.every_k <= 0:
            raise ConfigError("--every-k", self.every_k, "must be a positive integer")


@dataclass(frozen=True)
class StepRecord:
    step: int
    clock_s: float
    pool_gpus: int
    gen_len: float
    step_s: float
    predicted_step_s: float
    transition_s: float
    event: str  # "", "initial", "transition", "restart", "rejected", ...
    plan: str  # e.g. "actor-train=(dp,tp,pp) ..."
    max_gpu_id: int  # highest GPU id the plan uses
    plan_dict: dict[str, Any] = field(default_factory=dict, compare=False)
    triggers: tuple[str, ...] = ()
    admission: dict[str, Any] | None = None  # path, admitted, reason, delta_l_s, horizon_steps
    executor: str = ""  # how a transition ran: "dag", "staged", "gather-reload", "restart"


@dataclass(frozen=True)
class SimResult:
    policy: str
    steps: int
    mean_step_s: float
    total_s: float
    transitions: int
    transition_s: float
    wait_s: float
    records: tuple[StepRecord, ...]
    final_calibration: Calibration

    @property
    def pool_changes(self) -> int:
        """Changes of the GPU pool between consecutive simulated steps."""
        return sum(1 for a, b in itertools.pairwise(self.records) if a.pool_gpus != b.pool_gpus)

    def summary(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "steps": self.steps,
            "mean_step_s": self.mean_step_s,
            "total_s": self.total_s,
            "transitions": self.transitions,
            "transition_s": self.transition_s,
            "pool_changes": self.pool_changes,
        }


def plan_label(plan: ExecutionPlan) -> str:
    return " ".join(f"{sp.name}=({sp.dp},{sp.tp},{sp.pp})" for sp in plan.stages)


def restart_s(setup: Setup) -> float:
    """Seconds of a checkpoint/restart (:func:`nereus.transition.fallbacks.checkpoint_restart_s`)."""
    return checkpoint_restart_s(setup)


class _Clock:
    def __init__(self, trace: GpuTrace, num_gpus: int, max_wait_s: float) -> None:
        self.trace = trace
        self.num_gpus = num_gpus
        self.max_wait_s = max_wait_s
        self.t_s = 0.0
        self.wait_s = 0.0

    def pool(self) -> tuple[int, ...]:
        """GPUs available now (ids 0..n−1); waits while none are."""
        waited = 0.0
        while True:
            n = min(self.trace.at(self.t_s), self.num_gpus)
            if n > 0:
                return tuple(range(n))
            nxt = [t for t in self.trace.times_s if t > self.t_s]
            if not nxt or waited > self.max_wait_s:
                raise ConfigError("--gpu-trace", "empty pool", "no GPUs available for the rest of the trace")
            waited += nxt[0] - self.t_s
            self.wait_s += nxt[0] - self.t_s
            self.t_s = nxt[0]

    def wait_for_change(self) -> None:
        """Advance to the next change of the trace (the job waits without a feasible plan)."""
        now = self.trace.at(self.t_s)
        for t in self.trace.times_s:
            if t > self.t_s and self.trace.at(t) != now:
                self.wait_s += t - self.t_s
                self.t_s = t
                return
        raise ConfigError("--gpu-trace", f"{now} GPUs", "no feasible plan on the pool left for the rest of the trace")


def _controller_outcome(
    adm: Admission | None, plan: ExecutionPlan | None, truth: Truth, step: int, restart_cost: float
) -> tuple[str, float, ExecutionPlan | None, str]:
    """(event, seconds, plan after, executor) of a controller decision."""
    if adm is None:
        return "", 0.0, plan, ""
    if adm.admitted and adm.target is not None:
        if plan is None:
            return "initial", 0.0, adm.target, ""
        tr = adm.transition
        if adm.path == "restart" or tr is None or tr.executor == "restart":
            return "restart", restart_cost, adm.target, "restart"
        return "transition", truth.transition_s(tr.cost_s, step), adm.target, tr.executor
    return ("rejected" if adm.path == "opportunistic" else "infeasible"), 0.0, plan, ""


def _baseline_outcome(
    cfg: SimConfig,
    port: SearchPort,
    obs: Observation,
    plan: ExecutionPlan | None,
    layouts: dict[str, tuple[int, int]] | None,
    truth: Truth,
    step: int,
    restart_cost: float,
    pool_changed: bool,
) -> tuple[str, float, ExecutionPlan | None, str]:
    """static, every-k and oracle: when to switch and to what (event, seconds, plan after,
    executor); the transition is planned as the controller plans its own
    (:func:`nereus.transition.change.plan_change`)."""
    current_ok = plan is not None and port.evaluate(plan, obs).feasible
    found: tuple[ExecutionPlan, float] | None = None
    if cfg.policy == "oracle":
        found = replace(port, calib=truth.oracle_calibration(port.setup.cluster.gpu)).search(obs)
    elif cfg.policy == "every-k":
        if not current_ok or step % cfg.every_k == 0:
            found = port.search(obs)
    elif not current_ok or pool_changed:  # static: re-fit DP to the pool on fixed TP/PP layouts
        found = replace(port, layouts=layouts).search(obs)
        if found is None and layouts is not None:
            found = port.search(obs)  # the fixed layouts no longer fit at all
    if found is None or found[0] == plan:
        return "", 0.0, plan, ""
    target = found[0]
    if plan is None:
        return "initial", 0.0, target, ""
    if cfg.policy == "oracle":
        return "transition", 0.0, target, "free"
    planned = port.transition(plan, target)
    if planned is None or planned.executor == "restart":
        return "restart", restart_cost, target, "restart"
    return "transition", truth.transition_s(planned.cost_s, step), target, planned.executor


def _calibrated(
    cfg: SimConfig, calib: Calibration, setup: Setup, plan: ExecutionPlan,
    measured: dict[str, float], truth: Truth, step: int, alpha: float,
) -> Calibration:
    """``calib`` after the step's samples: measured stage times or profiled op samples."""
    gpu = setup.cluster.gpu
    if cfg.samples == "ops":
        for op, ideal_s, measured_s in truth.op_samples(gpu, step):
            calib = calib.with_time_sample(gpu, op, ideal_s, measured_s, alpha)
        return calib
    wf, gpn = setup.job.workflow, setup.cluster.gpus_per_node
    base = calib  # every model-stage is attributed against the same prediction
    for sp in plan.stages:
        lat = stage_latency(setup, wf.by_name(sp.name), sp.candidate, base)
        samples = stage_time_samples(lat, measured[sp.name], gpu, base, inter_node=sp.num_gpus > gpn)
        for op, ideal_s, sample_s in samples:
            calib = calib.with_time_sample(gpu, op, ideal_s, sample_s, alpha)
    return calib


def simulate(
    setup: Setup,
    gpu_trace: GpuTrace,
    lengths: LengthTrace,
    cfg: SimConfig,
    truth: Truth,
    start_calibration: Calibration,
    progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    """Run ``cfg.steps`` steps of ``cfg.policy``; deterministic for its inputs."""
    gpu = setup.cluster.gpu
    spec = setup.job.controller
    if cfg.policy == "dynarl":
        # DynaRL-style: replan at every step (no drift thresholds), admit any ΔL > 0.
        # No loss exposure: that policy weighs step time only.
        spec = replace(spec, gamma=float("inf"), delta_len=0.0, delta_efficiency=0.0,
                       loss_exposure=False)
    else:
        spec = replace(spec, gamma=cfg.gamma)
    clock = _Clock(gpu_trace, setup.cluster.num_gpus, cfg.max_wait_s)
    calib = start_calibration
    state = ControllerState()
    plan: ExecutionPlan | None = None
    layouts: dict[str, tuple[int, int]] | None = None
    records: list[StepRecord] = []
    transitions = 0
    transition_total = 0.0
    restart_cost = restart_s(setup)
    cache = CostCache()
    last_pool: tuple[int, ...] = ()

    for step in range(cfg.steps):
        while True:
            pool = clock.pool()
            lp = lengths.at(step)
            # The achieved-efficiency signals: the calibrated efficiency of every op class.
            effs = tuple(sorted((op.value, calib.efficiency(gpu, op)) for op in OpClass))
            obs = Observation(step, lp.mean, lp.p95, pool, efficiencies=effs)
            port = SearchPort(setup, calib, pool=pool, cache=cache)
            triggers: tuple[str, ...] = ()
            adm_row: dict[str, Any] | None = None
            if cfg.policy in ("nereus", "dynarl"):
                state, d = controller_step(state, obs, spec, port)
                adm = d.admission
                triggers = d.triggers
                if adm is not None:
                    adm_row = {
                        "path": adm.path, "admitted": adm.admitted, "reason": adm.reason,
                        "delta_l_s": adm.delta_l_s, "transition_s": adm.transition_s,
                        "horizon_steps": adm.horizon_steps,
                        "current_exposure_s": adm.current_exposure_s,
                        "options": [o.to_dict() for o in adm.options],
                    }
                event, trans_s, new_plan, executor = _controller_outcome(
                    adm, plan, truth, step, restart_cost)
            else:
                event, trans_s, new_plan, executor = _baseline_outcome(
                    cfg, port, obs, plan, layouts, truth, step, restart_cost, pool != last_pool
                )
                if event == "initial" and cfg.policy == "static" and new_plan is not None:
                    layouts = {sp.name: (sp.tp, sp.pp) for sp in new_plan.stages}
            last_pool = pool
            if new_plan is not None and port.evaluate(new_plan, obs).feasible:
                plan = new_plan
                break
            # No feasible plan on this pool: the job checkpoints and waits for the pool to change.
            clock.wait_for_change()
        assert plan is not None
        if event in ("transition", "restart"):
            transitions += 1
            transition_total += trans_s
        s_now = setup_for(setup, obs)
        predicted = plan_step_s(s_now, plan, calib)
        step_s, measured = truth.step_s(s_now, plan, step)
        records.append(StepRecord(
            step, clock.t_s, len(pool), lp.mean, step_s, predicted, trans_s, event,
            plan_label(plan), max(g for sp in plan.stages for g in sp.gpus),
            plan.to_dict() if event else {}, triggers, adm_row, executor,
        ))
        clock.t_s += trans_s + step_s
        calib = _calibrated(cfg, calib, s_now, plan, measured, truth, step, spec.calibration_alpha)
        if progress is not None:
            progress(step + 1, cfg.steps)

    total_s = sum(r.step_s for r in records) + transition_total
    return SimResult(
        policy=cfg.policy,
        steps=cfg.steps,
        mean_step_s=total_s / cfg.steps,  # transitions included: what a step costs on average
        total_s=total_s,
        transitions=transitions,
        transition_s=transition_total,
        wait_s=clock.wait_s,
        records=tuple(records),
        final_calibration=calib,
    )
