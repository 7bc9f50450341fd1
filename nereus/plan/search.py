"""Plan search entry point: the fastest placed plan that fits every GPU (DESIGN.md §2.1, §3).

``search_plan`` enumerates and costs the candidates of every model-stage, solves the problem of
``nereus.plan.problem`` (``method``: the frontier DP, the exhaustive enumerator or the MILP),
assigns GPUs node-aware and verifies the placed plan against the full per-GPU memory model
``gpu_memory`` and the placement rules. The memory bound it solves under is an upper bound of
``gpu_memory``, so the check should never fail; if it does, the bound is tightened by the
overshoot and the next-best plan is taken. An infeasible plan is never returned.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from nereus.cost.calibration import Calibration, default_calibration
from nereus.cost.latency import StageLatency
from nereus.cost.memory import MemoryBreakdown, gpu_memory
from nereus.errors import ConfigError, InfeasiblePlanError
from nereus.plan import dp, exhaustive
from nereus.plan.assign import assign, placement_errors
from nereus.plan.candidates import CostCache, Costed
from nereus.plan.problem import Problem, build_problem, check_pool, no_plan_reason, step_s
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan
from nereus.spec.workflow import Workflow

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

METHODS = ("dp", "exhaustive", "milp")
MAX_FALLBACKS = 8


@dataclass(frozen=True)
class PlanResult:
    plan: ExecutionPlan  # placed: every StagePlan has replicas
    predicted_step_s: float
    stage_latencies: tuple[StageLatency, ...]
    stage_memory: tuple[tuple[str, MemoryBreakdown], ...]
    gpu_peak_bytes: tuple[tuple[int, int], ...]  # from gpu_memory
    peak_memory_bytes: int  # max over GPUs
    capacity_bytes: int
    candidates_considered: int
    method: str


def _solve(problem: Problem, method: str, time_limit_s: float) -> dict[str, Costed] | None:
    if method == "dp":
        return dp.solve(problem)
    if method == "exhaustive":
        return exhaustive.solve(problem, max(1, int(time_limit_s * exhaustive.VISITS_PER_SECOND)))
    from nereus.plan import milp  # needs the optional solver extra

    return milp.solve(problem, time_limit_s)


def search_plan(
    setup: Setup,
    calib: Calibration | None = None,
    pool: Sequence[int] | None = None,
    method: str = "dp",
    time_limit_s: float = 60.0,
    cache: CostCache | None = None,
    layouts: Mapping[str, tuple[int, ...]] | None = None,
    workflow: Workflow | None = None,
    keep: ExecutionPlan | None = None,
) -> PlanResult:
    """The plan minimizing the predicted step time on ``pool`` (default: the whole cluster).

    ``cache`` keeps cost evaluations across calls with the same setup and calibration (a replan
    after a pool change); without it every candidate is costed afresh. ``layouts`` pins the
    (tp, pp) of the model-stages it names (DP and placement are still searched), or their
    (tp, pp, dp).
    ``time_limit_s`` bounds the references only: the MILP solver's time cap, and the exhaustive
    enumeration's work (``exhaustive.VISITS_PER_SECOND`` combinations per second, no clock). Raises
    ``InfeasiblePlanError`` naming the tightest constraint when no plan fits.

    On a cluster of several hardware types (``ClusterSpec.heterogeneous``) the vendor-aware
    search of :mod:`nereus.plan.hetero` answers (``cache`` unused there: each call costs every
    type's tables afresh, about 1 s at 128 GPUs of two types). ``workflow``: plan only this part
    of the job's workflow (that search's per-type parts). ``keep``: the running plan, whose
    replicas stay where they are when their model-stage keeps its (tp, pp)
    (:func:`nereus.plan.assign.assign`).
    """
    if setup.cluster.heterogeneous:
        from nereus.plan import hetero  # it plans each type's part through this function

        return hetero.search_mixed(setup, calib, pool, method, time_limit_s, layouts)
    if method not in METHODS:
        raise ConfigError("method", method, f"must be one of {', '.join(METHODS)}")
    if not time_limit_s > 0:
        raise ConfigError("time_limit_s", time_limit_s, "must be > 0")
    calib = calib if calib is not None else default_calibration()
    pool_t = check_pool(setup, pool)
    problem = build_problem(
        setup, calib, pool_t, cache if cache is not None else CostCache(), layouts, workflow
    )
    capacity = problem.capacity_bytes
    for _ in range(MAX_FALLBACKS):
        choice = _solve(problem, method, time_limit_s)
        if choice is None:
            raise InfeasiblePlanError(no_plan_reason(problem))
        wf = problem.workflow
        plan = assign(setup, {n: c.cand for n, c in choice.items()}, pool_t, wf, keep)
        errors = placement_errors(setup, plan, pool_t, wf)
        if errors:
            raise InfeasiblePlanError(f"placement failed: {errors[0]}")
        per_gpu = gpu_memory(setup, plan, calib)
        peak = max(per_gpu.values())
        if peak <= capacity:
            names = wf.names
            return PlanResult(
                plan=plan,
                predicted_step_s=step_s(problem, choice),
                stage_latencies=tuple(choice[n].latency for n in names),
                stage_memory=tuple((n, choice[n].memory) for n in names),
                gpu_peak_bytes=tuple(sorted(per_gpu.items())),
                peak_memory_bytes=peak,
                capacity_bytes=capacity,
                candidates_considered=problem.candidates_considered,
                method=method,
            )
        # The bound missed a co-residency effect: tighten it by the overshoot and retry.
        problem = replace(problem, capacity_bytes=problem.capacity_bytes - (peak - capacity))
    raise InfeasiblePlanError(
        f"no plan passes the per-GPU memory check after {MAX_FALLBACKS} tightenings "
        f"(capacity {capacity / 1e9:.1f} GB)"
    )
