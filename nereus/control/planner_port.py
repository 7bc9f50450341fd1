"""The planner port the controller calls: plan search, plan evaluation and transition cost.

Pure: the cost model, the plan search and the transition-DAG compiler over plain data. The same
port serves the simulator and the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from nereus.control.controller import PlanEvaluation
from nereus.control.signals import Observation
from nereus.cost.calibration import Calibration
from nereus.cost.latency import stage_latency, step_latency_s
from nereus.cost.memory import gpu_memory, memory_capacity_bytes
from nereus.emu.unit import Emu, emus_of_plan
from nereus.errors import InfeasiblePlanError, TransitionError
from nereus.plan.candidates import CostCache
from nereus.plan.search import search_plan
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan
from nereus.transition.dag import TransitionDag
from nereus.transition.fast import PlannedTransition, plan_plans
from nereus.transition.primitives import model_replicated_sizer, model_state_sizer


def setup_for(setup: Setup, obs: Observation) -> Setup:
    """The job as observed: generated lengths from the observation (mean for time, p95 for memory)."""
    mean = max(1, round(obs.gen_len_mean))
    p95 = max(mean, round(obs.gen_len_p95))
    return replace(setup, job=replace(setup.job, gen_len=mean, gen_len_p95=p95))


def stage_states(setup: Setup) -> dict[str, str]:
    """Logical state per model-stage for the DAG: each model-stage's units are replicas of one
    state (actor-gen holds weights only, actor-train weights and optimizer: distinct states)."""
    return {ms.name: ms.name for ms in setup.job.workflow.model_stages}


def plan_step_s(setup: Setup, plan: ExecutionPlan, calib: Calibration) -> float:
    wf = setup.job.workflow
    times = {sp.name: stage_latency(setup, wf.by_name(sp.name), sp.candidate, calib).total_s for sp in plan.stages}
    return step_latency_s(wf, times)


def surviving_units(setup: Setup, plan: ExecutionPlan, pool: Sequence[int] | None) -> tuple[Emu, ...]:
    """The EMUs of ``plan`` whose GPUs are all still in ``pool`` (all of them when None)."""
    units = emus_of_plan(plan, stage_states(setup))
    if pool is None:
        return units
    alive = set(pool)
    return tuple(u for u in units if alive.issuperset(u.gpus))


def plan_dag(
    setup: Setup, current: ExecutionPlan, target: ExecutionPlan, pool: Sequence[int] | None = None
) -> PlannedTransition:
    """The transition from the units of ``current`` that survive on ``pool`` to ``target``,
    planned on the batched path (:func:`nereus.transition.fast.plan_plans`): ``.cost_s`` is
    L̂_tran, ``.dag`` the per-primitive DAG (built on demand; what :func:`compile_dag` returns).

    Raises TransitionError when no DAG exists — including when every replica of some
    model-stage was lost (its state must come from a checkpoint)."""
    wf = setup.job.workflow
    models = {ms.name: setup.job.model(ms.role) for ms in wf.model_stages}
    trainable = {ms.name: ms.trainable for ms in wf.model_stages}
    sizer = model_state_sizer(models, trainable, setup.job.dtype_bytes)
    replicated = model_replicated_sizer(models, trainable, setup.job.dtype_bytes)
    alive = None if pool is None else set(pool)
    lost = sorted(sp.name for sp in current.stages
                  if not any(alive is None or alive.issuperset(r) for r in sp.replicas))
    if lost:
        raise TransitionError(f"every replica of {', '.join(lost)} was lost")
    return plan_plans(
        current, target, stage_states(setup), sizer,
        capacity_bytes=setup.cluster.gpu.memory_bytes, conflicts=wf.concurrent,
        replicated=replicated, alive=alive,
    )


def compile_dag(
    setup: Setup, current: ExecutionPlan, target: ExecutionPlan, pool: Sequence[int] | None = None
) -> TransitionDag:
    """The transition DAG from the units of ``current`` that survive on ``pool`` to ``target``
    (the DAG :func:`nereus.transition.compile.compile_transition` builds from those units).

    Raises TransitionError when no DAG exists — including when every replica of some
    model-stage was lost (its state must come from a checkpoint)."""
    return plan_dag(setup, current, target, pool).dag


@dataclass(frozen=True)
class SearchPort:
    """Controller port over ``search_plan``. ``layouts`` pins (tp, pp) per model-stage (the
    static baseline: fixed TP/PP, DP scaled to the pool)."""

    setup: Setup
    calib: Calibration
    method: str = "dp"
    layouts: Mapping[str, tuple[int, int]] | None = None
    pool: tuple[int, ...] | None = None  # GPUs alive now: units elsewhere are lost
    cache: CostCache | None = None  # per-candidate costs kept across replans (memoization only)

    def evaluate(self, plan: ExecutionPlan, obs: Observation) -> PlanEvaluation:
        s = setup_for(self.setup, obs)
        pool = set(obs.pool)
        missing = sorted({g for sp in plan.stages for g in sp.gpus} - pool)
        if missing:
            return PlanEvaluation(float("inf"), False, f"GPUs {missing} not in the pool")
        step_s = plan_step_s(s, plan, self.calib)
        peak = max(gpu_memory(s, plan, self.calib).values(), default=0)
        cap = memory_capacity_bytes(s)
        if peak > cap:
            return PlanEvaluation(step_s, False, f"peak {peak / 1e9:.1f} GB > capacity {cap / 1e9:.1f} GB")
        return PlanEvaluation(step_s, True)

    def search(self, obs: Observation) -> tuple[ExecutionPlan, float] | None:
        s = setup_for(self.setup, obs)
        try:
            res = search_plan(
                s, self.calib, pool=tuple(obs.pool), method=self.method, cache=self.cache,
                layouts=self.layouts,
            )
        except InfeasiblePlanError:
            return None
        return res.plan, res.predicted_step_s

    def options(self, obs: Observation, current: ExecutionPlan | None) -> Sequence[tuple[ExecutionPlan, float]]:
        out: list[tuple[ExecutionPlan, float]] = []
        best = self.search(obs)
        if best is not None:
            out.append(best)
        if current is not None and self.layouts is None:
            # A slightly slower target with a cheaper transition: keep every model-stage's
            # current TP/PP and re-fit only DP and placement (Extend/Destroy only).
            keep = {sp.name: (sp.tp, sp.pp) for sp in current.stages}
            pinned = replace(self, layouts=keep).search(obs)
            if pinned is not None and (best is None or pinned[0] != best[0]):
                out.append(pinned)
        out.sort(key=lambda o: o[1])
        return out

    def transition_s(self, current: ExecutionPlan, target: ExecutionPlan) -> float | None:
        if current == target:
            return 0.0
        try:
            planned = plan_dag(self.setup, current, target, self.pool)
        except TransitionError:
            return None
        return planned.cost_s(self.setup.cluster)
