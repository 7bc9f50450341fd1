"""The planner port the controller calls: plan search, plan evaluation and the planned
transition (its DAG and L̂_tran, :func:`nereus.transition.plan_transition`).

Pure: the cost model, the plan search and the transition-DAG compiler over plain data. The same
port serves the simulator and the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from nereus.control.controller import PlanEvaluation
from nereus.control.exposure import PoolHistory, exposure_s
from nereus.control.options import candidate_targets
from nereus.control.signals import Observation
from nereus.cost.calibration import Calibration
from nereus.cost.latency import stage_latency, step_latency_s
from nereus.cost.memory import gpu_memory, memory_capacity_bytes
from nereus.emu.unit import emus_of_plan
from nereus.errors import InfeasiblePlanError
from nereus.plan.candidates import CostCache
from nereus.plan.search import search_plan
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan
from nereus.transition.change import plan_change
from nereus.transition.dag import TransitionDag
from nereus.transition.planned import PlannedTransition, stage_states


def setup_for(setup: Setup, obs: Observation) -> Setup:
    """The job as observed: generated lengths from the observation (mean for time, p95 for
    memory), and on CPU ranks sharing a host how many of them run (the pool)."""
    mean = max(1, round(obs.gen_len_mean))
    p95 = max(mean, round(obs.gen_len_p95))
    cluster = setup.cluster
    if cluster.host_cores and cluster.busy_gpus != len(obs.pool):  # CPU ranks: the pool runs
        cluster = replace(cluster, busy_gpus=len(obs.pool))
    return replace(setup, job=replace(setup.job, gen_len=mean, gen_len_p95=p95), cluster=cluster)


def plan_step_s(setup: Setup, plan: ExecutionPlan, calib: Calibration) -> float:
    if setup.cluster.heterogeneous:  # each replica on its own type, weight sync across types
        from nereus.plan.hetero import evaluate_plan

        return evaluate_plan(setup, plan, calib).step_s
    return step_latency_s(setup.job.workflow, plan_stage_s(setup, plan, calib))


def plan_stage_s(setup: Setup, plan: ExecutionPlan, calib: Calibration) -> dict[str, float]:
    """Predicted seconds of every model-stage of ``plan`` (one hardware type)."""
    wf = setup.job.workflow
    return {sp.name: stage_latency(setup, wf.by_name(sp.name), sp.candidate, calib).total_s
            for sp in plan.stages}


@dataclass(frozen=True)
class SearchPort:
    """Controller port over ``search_plan``. ``layouts`` pins (tp, pp) per model-stage (the
    static baseline: fixed TP/PP, DP scaled to the pool)."""

    setup: Setup
    calib: Calibration
    method: str = "dp"
    layouts: Mapping[str, tuple[int, ...]] | None = None
    pool: tuple[int, ...] | None = None  # GPUs alive now: units elsewhere are lost
    cache: CostCache | None = None  # per-candidate costs kept across replans (memoization only)
    # the running plan: replicas of a model-stage keeping its (tp, pp) stay on their GPUs
    keep: ExecutionPlan | None = None

    def evaluate(self, plan: ExecutionPlan, obs: Observation) -> PlanEvaluation:
        s = setup_for(self.setup, obs)
        pool = set(obs.pool)
        missing = sorted({g for sp in plan.stages for g in sp.gpus} - pool)
        if missing:
            return PlanEvaluation(float("inf"), False, f"GPUs {missing} not in the pool")
        if s.cluster.heterogeneous:
            from nereus.plan.hetero import evaluate_plan

            cost = evaluate_plan(s, plan, self.calib)
            if cost.type_errors or cost.over_capacity:
                why = (cost.type_errors[0] if cost.type_errors else
                       f"GPUs {list(cost.over_capacity)[:8]} over their type's capacity")
                return PlanEvaluation(cost.step_s, False, why)
            return PlanEvaluation(cost.step_s, True)
        step_s = plan_step_s(s, plan, self.calib)
        peak = max(gpu_memory(s, plan, self.calib).values(), default=0)
        cap = memory_capacity_bytes(s)
        if peak > cap:
            return PlanEvaluation(step_s, False, f"peak {peak / 1e9:.1f} GB > capacity {cap / 1e9:.1f} GB")
        return PlanEvaluation(step_s, True)

    def stage_times(self, plan: ExecutionPlan, obs: Observation) -> dict[str, float]:
        """Predicted seconds per model-stage under ``obs`` (the tie rule's band; empty on a
        mixed cluster, where the band falls back to the whole step)."""
        s = setup_for(self.setup, obs)
        return {} if s.cluster.heterogeneous else plan_stage_s(s, plan, self.calib)

    def exposure(self, plan: ExecutionPlan, history: PoolHistory,
                 horizon_steps: float) -> float:
        """Expected checkpoint/restart seconds of ``plan`` within the horizon
        (:func:`nereus.control.exposure.exposure_s`)."""
        return exposure_s(self.setup, plan, history, horizon_steps)

    def search(self, obs: Observation) -> tuple[ExecutionPlan, float] | None:
        s = setup_for(self.setup, obs)
        try:
            res = search_plan(
                s, self.calib, pool=tuple(obs.pool), method=self.method, cache=self.cache,
                layouts=self.layouts, keep=self.keep,
            )
        except InfeasiblePlanError:
            return None
        return res.plan, res.predicted_step_s

    def options(self, obs: Observation, current: ExecutionPlan | None) -> Sequence[tuple[ExecutionPlan, float]]:
        """S* and a few slower plans with cheaper transitions from ``current``
        (:func:`nereus.control.options.candidate_targets`), every one placed around what runs
        (sticky placement: ``keep``); S* alone when layouts are pinned."""
        if current is not None and self.keep is None:  # targets placed around what runs
            return replace(self, keep=current).options(obs, current)
        if self.layouts is not None:
            best = self.search(obs)
            return [] if best is None else [best]
        return candidate_targets(lambda lay: replace(self, layouts=lay).search(obs), self.setup,
                                 current, self.setup.job.controller.targets)

    def transition(self, current: ExecutionPlan, target: ExecutionPlan
                   ) -> PlannedTransition | None:
        """:func:`nereus.transition.change.plan_change` from the units of ``current`` alive on
        the pool to ``target``: the DAG, else the host-staged DAG, else gather-and-reload,
        else checkpoint/restart (priced, with the reason)."""
        if current == target:
            units = emus_of_plan(current, stage_states(self.setup))
            return PlannedTransition(0.0, reference=TransitionDag(units, units, (), (), ()))
        return plan_change(self.setup, current, target, self.pool, self.calib,
                           staging=self.setup.job.controller.host_staging)
