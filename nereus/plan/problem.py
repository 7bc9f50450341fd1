"""The plan-search problem shared by the DP, the exhaustive enumerator and the MILP.

Given the costed candidates of every model-stage, choose one per model-stage so that

- **GPU budgets**: lanes run concurrently on disjoint GPUs, phases of a lane one after another on
  shared GPUs, model-stages of a phase on disjoint GPUs. With the lane demand at block level s
  ``D_l[s] = max_{phase ∈ l} Σ_{M ∈ phase} |R_M|·[block_M ≥ s]`` the plan can be placed on the pool
  iff ``Σ_l D_l[s] ≤ cap_s`` for every level (``candidates.pool_levels``; level 1 is
  ``Σ_l max_phase Σ_M |R_M| ≤ |P_gpu|``).
- **Memory bound** (co-residency): a GPU of a lane holds at most one model-stage of each phase of
  the lane (model-stages of a phase are disjoint), so whatever the assignment its peak is at most
  ``max_{φ*} [PT_{φ*} + Σ_{φ ≠ φ*} P_φ]`` where ``P_φ`` is the largest persistent and ``PT_φ`` the
  largest peak bytes per GPU of the chosen candidates of phase φ. The bound must be ≤ capacity.
  It is an upper bound of ``nereus.cost.memory.gpu_memory`` (which keeps a shared logical state
  once and overlapping phases never add), so a plan that meets it passes the full check on every
  GPU under any assignment that respects the budgets.
- **Objective**: the step's critical path ``step_latency_s`` (lanes max, phases sum, max in phase).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nereus.cost.calibration import Calibration
from nereus.cost.latency import step_latency_s
from nereus.cost.memory import memory_capacity_bytes
from nereus.errors import ConfigError, InfeasiblePlanError
from nereus.plan.candidates import (
    CostCache,
    Costed,
    StageTable,
    demand_of,
    layouts_of,
    node_counts,
    pool_levels,
)
from nereus.spec.job import Setup
from nereus.spec.workflow import Workflow

GB = 1e9


def gb_text(nbytes: float) -> str:
    """Bytes as GB, with two decimals below 10 GB so that small models stay readable."""
    return f"{nbytes / GB:.1f}" if nbytes >= 10 * GB else f"{nbytes / GB:.2f}"


def _fits(c: Costed, levels: tuple[int, ...], caps: tuple[int, ...]) -> bool:
    g = c.num_gpus
    if g > caps[0]:
        return False
    return all(not (c.block >= s and g > cap) for s, cap in zip(levels, caps, strict=True))


@dataclass(frozen=True)
class StageSpace:
    """The costed plan space of one model-stage restricted to a pool."""

    name: str
    table: StageTable
    levels: tuple[int, ...]
    caps: tuple[int, ...]

    @property
    def front(self) -> tuple[Costed, ...]:
        """Frontier candidates that fit the pool, by latency."""
        if len(self.levels) == 1:  # whole nodes only: the GPU count is the one constraint
            return tuple(c for c in self.table.front if c.num_gpus <= self.caps[0])
        return tuple(c for c in self.table.front if _fits(c, self.levels, self.caps))

    @property
    def fits_pool(self) -> bool:
        """Some frontier candidate fits the pool."""
        if len(self.levels) == 1:
            sizes = self.table.gpu_counts
            return bool(sizes) and sizes[0] <= self.caps[0]
        return len(self.table.fitting(self.levels, self.caps)) > 0

    @property
    def feasible(self) -> tuple[Costed, ...]:
        """Every candidate that fits the pool and one GPU's capacity, by key."""
        return tuple(c for c in self.table.feasible if _fits(c, self.levels, self.caps))

    @property
    def enumerated(self) -> int:
        return self.table.enumerated(self.caps[0])

    @property
    def min_peak_bytes(self) -> int:
        return self.table.min_peak_bytes(self.caps[0])


@dataclass(frozen=True)
class Problem:
    setup: Setup
    workflow: Workflow
    pool: tuple[int, ...]
    levels: tuple[int, ...]
    caps: tuple[int, ...]
    capacity_bytes: int
    spaces: tuple[StageSpace, ...]  # in workflow order

    def demand(self, c: Costed) -> tuple[int, ...]:
        """GPUs ``c`` needs at each level of the pool."""
        return demand_of(c.block, c.num_gpus, self.levels)

    def space(self, name: str) -> StageSpace:
        for s in self.spaces:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def candidates_considered(self) -> int:
        return sum(s.enumerated for s in self.spaces)


def check_pool(setup: Setup, pool: Sequence[int] | None) -> tuple[int, ...]:
    """The pool as sorted unique GPU ids of the cluster; ``ConfigError`` on a bad id."""
    if pool is None:
        return setup.cluster.all_gpus()
    n = setup.cluster.num_gpus
    for g in pool:
        if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < n:
            raise ConfigError("pool", g, f"GPU id must be an integer in [0, {n})")
    if len(set(pool)) != len(pool):
        raise ConfigError("pool", tuple(pool), "GPU ids must be unique")
    return tuple(sorted(pool))


def build_problem(
    setup: Setup,
    calib: Calibration,
    pool: tuple[int, ...],
    cache: CostCache,
    layouts: Mapping[str, tuple[int, ...]] | None = None,
    workflow: Workflow | None = None,
) -> Problem:
    """Restrict every costed plan space to ``pool`` (and a model-stage named in ``layouts`` to
    that (tp, pp), or (tp, pp, dp)); ``InfeasiblePlanError`` if one is empty. ``workflow``: the
    job's, or a part of it (the model-stages one hardware type runs: :mod:`nereus.plan.hetero`)."""
    if not pool:
        raise InfeasiblePlanError("the GPU pool is empty")
    workflow = workflow if workflow is not None else setup.job.workflow
    capacity = memory_capacity_bytes(setup)
    levels, caps = pool_levels(pool, setup.cluster.gpus_per_node)
    spaces: list[StageSpace] = []
    for ms in workflow.model_stages:
        if layouts is not None and ms.name in layouts:
            table = cache.pinned(setup, ms, calib, tuple(int(v) for v in layouts[ms.name]))
        else:
            table = cache.table(setup, ms, calib)
        spaces.append(StageSpace(ms.name, table, levels, caps))
    short = [s for s in spaces if not s.fits_pool]
    if short:
        gpn = setup.cluster.gpus_per_node
        no_space = [s for s in short if s.enumerated == 0]
        pinned = [s for s in short if layouts is not None and s.name in layouts]
        if pinned:
            s = pinned[0]
            assert layouts is not None
            raise InfeasiblePlanError(
                f"{s.name} has no memory-feasible candidate with (tp, pp{', dp' * (len(layouts[s.name]) > 2)}) = {tuple(layouts[s.name])} "
                f"on {len(pool)} GPUs"
            )
        if no_space:
            s = no_space[0]
            raise InfeasiblePlanError(
                f"{s.name} has no candidate on {len(pool)} GPUs: dp must divide "
                f"its sequences and tp·pp fit the pool"
            )
        worst = max(short, key=lambda s: s.min_peak_bytes)
        ms = workflow.by_name(worst.name)
        lay = layouts_of(setup, ms, len(pool))
        max_tp = max((t for t, _ in lay), default=1)
        max_pp = max((p for _, p in lay), default=1)
        if worst.min_peak_bytes <= capacity:  # fits memory, but not the nodes of this pool
            raise InfeasiblePlanError(
                f"{worst.name}: no memory-feasible candidate can be placed on the pool's nodes "
                f"(GPUs per node available: {[a for _, a in node_counts(pool, gpn)]})"
            )
        raise InfeasiblePlanError(
            f"{worst.name} needs {gb_text(worst.min_peak_bytes)} GB per GPU at tp≤{max_tp}, "
            f"pp≤{max_pp} on {len(pool)} GPUs ({gpn} per node), capacity {gb_text(capacity)} GB"
        )
    return Problem(setup, workflow, pool, levels, caps, capacity, tuple(spaces))


def lane_demand(
    problem: Problem, lane: Sequence[Sequence[str]], choice: Mapping[str, Costed]
) -> tuple[int, ...]:
    out = [0] * len(problem.levels)
    for phase in lane:
        for k in range(len(out)):
            out[k] = max(out[k], sum(problem.demand(choice[n])[k] for n in phase))
    return tuple(out)


def within_budget(problem: Problem, choice: Mapping[str, Costed]) -> bool:
    total = [0] * len(problem.levels)
    for lane in problem.workflow.lanes:
        for k, d in enumerate(lane_demand(problem, lane, choice)):
            total[k] += d
    return all(t <= c for t, c in zip(total, problem.caps, strict=True))


def lane_bound_bytes(lane: Sequence[Sequence[str]], choice: Mapping[str, Costed]) -> int:
    """``Σ_φ P_φ + max_φ (PT_φ − P_φ)`` of one lane (module docstring)."""
    p_sum = 0
    excess = 0
    for phase in lane:
        p = max((choice[n].persistent_bytes for n in phase), default=0)
        pt = max((choice[n].peak_bytes for n in phase), default=0)
        p_sum += p
        excess = max(excess, pt - p)
    return p_sum + excess


def memory_bound_bytes(problem: Problem, choice: Mapping[str, Costed]) -> int:
    """The largest per-GPU bound over the lanes."""
    return max((lane_bound_bytes(lane, choice) for lane in problem.workflow.lanes), default=0)


def is_feasible(problem: Problem, choice: Mapping[str, Costed]) -> bool:
    return within_budget(problem, choice) and memory_bound_bytes(problem, choice) <= problem.capacity_bytes


def step_s(problem: Problem, choice: Mapping[str, Costed]) -> float:
    return step_latency_s(problem.workflow, {n: c.latency_s for n, c in choice.items()})


def no_plan_reason(problem: Problem) -> str:
    """The tightest constraint when every model-stage fits alone but no combination does."""
    wf, cap = problem.workflow, problem.capacity_bytes
    least = {s.name: min(c.num_gpus for c in s.front) for s in problem.spaces}
    need = sum(max(sum(least[n] for n in phase) for phase in lane) for lane in wf.lanes)
    if need > len(problem.pool):
        lane_txt = " + ".join(
            "max(" + ", ".join("+".join(ph) for ph in lane) + ")" for lane in wf.lanes
        )
        return (
            f"GPU budget: the memory-feasible candidates need at least {need} GPUs "
            f"({lane_txt}), the pool has {len(problem.pool)}"
        )
    # Smallest memory bound any combination could reach, ignoring the budgets.
    lo: dict[str, Costed] = {}
    for s in problem.spaces:
        lo[s.name] = min(s.front, key=lambda c: (c.persistent_bytes, c.peak_bytes, c.key))
    worst_lane = max(wf.lanes, key=lambda lane: lane_bound_bytes(lane, lo))
    names = ", ".join(n for ph in worst_lane for n in ph)
    return (
        f"co-resident model-stages ({names}) need about "
        f"{gb_text(lane_bound_bytes(worst_lane, lo))} GB per GPU together within a budget of "
        f"{len(problem.pool)} GPUs, capacity {gb_text(cap)} GB"
    )
