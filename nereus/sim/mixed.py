"""Mixed pools in the simulator: one GPU trace per hardware type (issue 23).

E.g. spot NVIDIA nodes beside reserved AMD nodes: the pool at simulated time t holds, of every
type, the first ``trace_t(t)`` GPUs of that type's nodes. Each step: read the pool; let the
policy decide (and pay for) a transition; run the step. Step and transition times come from the
cost model itself, with each replica on its own type (:func:`nereus.plan.hetero.evaluate_plan`,
the "true" calibration given) and transitions from the same DAG compiler (every transfer between
vendors on the host transport's link class), planned as the controller plans its own
(:func:`nereus.transition.change.plan_change`: the DAG, else host-staged, else gather-and-reload
at its predicted cost); one that only a checkpoint/restart can make costs
:func:`nereus.sim.engine.restart_s`. Policies:

- ``vendor-aware``: the controller of §2.1 (``controller_step``) over the vendor-aware planner;
- ``fast-only``: the best plan on one type alone (its GPUs of the pool, that type's own cost), re-planned
  whenever its pool changes or the plan stops fitting;
- ``vendor-blind``: a planner that takes every GPU of the pool for ``blind_gpu`` (one type's
  spec, device links everywhere), re-planned likewise; its plans are costed truthfully on the
  mixed pool (replicas on the other type run at that type's speed, DP sync and any unit across
  vendors go through the host link, a GPU over its own capacity is an out-of-memory failure:
  a restart onto a vendor-aware plan).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from nereus.control.controller import ControllerState, controller_step
from nereus.control.planner_port import SearchPort
from nereus.control.signals import Observation
from nereus.cost.calibration import Calibration
from nereus.errors import ConfigError, InfeasiblePlanError
from nereus.plan.hetero import evaluate_plan
from nereus.plan.search import search_plan
from nereus.sim.engine import plan_label, restart_s
from nereus.sim.traces import GpuTrace
from nereus.spec.hardware import GpuSpec
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan
from nereus.transition.change import plan_change

MIXED_POLICIES = ("vendor-aware", "fast-only", "vendor-blind")


def mixed_pool(setup: Setup, traces: Mapping[str, GpuTrace], t_s: float) -> tuple[int, ...]:
    """The pool at ``t_s``: per type, the first ``traces[type].at(t_s)`` of its GPUs (a type
    without a trace: all of them)."""
    cl = setup.cluster
    out: list[int] = []
    for t in cl.types:
        mine = cl.gpus_of(t)
        n = traces[t.name].at(t_s) if t.name in traces else len(mine)
        out.extend(mine[:max(0, min(n, len(mine)))])
    return tuple(sorted(out))


def check_traces(setup: Setup, traces: Mapping[str, GpuTrace]) -> None:
    names = [t.name for t in setup.cluster.types]
    for name in traces:
        if name not in names:
            raise ConfigError("gpu_traces", name, f"no such hardware type (types: {', '.join(names)})")


@dataclass(frozen=True)
class MixedStep:
    step: int
    t_s: float
    pool_by_type: tuple[tuple[str, int], ...]
    step_s: float
    transition_s: float
    event: str  # "", initial, transition, restart, oom
    plan: str
    wait_s: float = 0.0  # the job waited this long for GPUs before the step


@dataclass(frozen=True)
class MixedResult:
    policy: str
    steps: int
    mean_step_s: float  # transitions included
    total_s: float
    transitions: int
    transition_s: float
    restarts: int
    records: tuple[MixedStep, ...]
    wait_s: float = 0.0  # time without a plan on the pool (not in total_s)

    @property
    def makespan_s(self) -> float:
        """Wall-clock time of the run: steps, transitions and waits."""
        return self.total_s + self.wait_s

    def summary(self) -> dict[str, object]:
        return {"policy": self.policy, "steps": self.steps, "mean_step_s": self.mean_step_s,
                "total_s": self.total_s, "wait_s": self.wait_s, "makespan_s": self.makespan_s,
                "transitions": self.transitions,
                "transition_s": self.transition_s, "restarts": self.restarts,
                "last_plan": self.records[-1].plan if self.records else ""}


def _next_change_s(traces: Mapping[str, GpuTrace], t_s: float) -> float | None:
    later = [x for tr in traces.values() for x in tr.times_s if x > t_s]
    return min(later) if later else None


def _baseline_target(policy: str, setup: Setup, calib: Calibration, pool: tuple[int, ...],
                     fast: GpuSpec, blind: GpuSpec) -> ExecutionPlan | None:
    cl = setup.cluster
    try:
        if policy == "fast-only":
            mine = tuple(g for g in pool if cl.gpu_of(g) == fast)
            if not mine:
                return None
            return search_plan(replace(setup, cluster=cl.typed(fast)), calib, mine).plan
        return search_plan(replace(setup, cluster=cl.typed(blind)), calib, pool).plan
    except InfeasiblePlanError:
        return None


def simulate_mixed(setup: Setup, traces: Mapping[str, GpuTrace], steps: int, policy: str,
                   calib: Calibration, *, fast: GpuSpec | None = None,
                   blind: GpuSpec | None = None, gamma: float = 0.5) -> MixedResult:
    """Run ``steps`` steps of ``policy`` on the mixed pool the per-type ``traces`` give
    (deterministic). ``fast``: the type of ``fast-only``; ``blind``: the type a vendor-blind
    planner takes every GPU for (both default to the cluster's first type)."""
    if policy not in MIXED_POLICIES:
        raise ConfigError("policy", policy, f"must be one of {', '.join(MIXED_POLICIES)}")
    check_traces(setup, traces)
    cl = setup.cluster
    fast = fast if fast is not None else cl.types[0]
    blind = blind if blind is not None else cl.types[0]
    spec = replace(setup.job.controller, gamma=gamma)
    state = ControllerState()
    plan: ExecutionPlan | None = None
    t_s = 0.0
    last_pool: tuple[int, ...] = ()
    records: list[MixedStep] = []
    total_trans = 0.0
    transitions = restarts = 0
    restart_cost = restart_s(setup)
    wait_total = 0.0
    for step in range(steps):
        waited = 0.0
        while True:  # until the policy has a plan on the pool; the job waits meanwhile
            pool = mixed_pool(setup, traces, t_s)
            usable = pool if policy != "fast-only" else tuple(
                g for g in pool if cl.gpu_of(g) == fast)
            target: ExecutionPlan | None = None
            if usable:
                obs = Observation(step, setup.job.gen_len,
                                  setup.job.gen_len_p95 or setup.job.gen_len, pool)
                port = SearchPort(setup, calib, pool=pool)
                target = plan
                if policy == "vendor-aware":
                    state, d = controller_step(state, obs, spec, port)
                    adm = d.admission
                    if adm is not None and adm.admitted and adm.target is not None:
                        target = adm.target
                elif plan is None or not port.evaluate(plan, obs).feasible or pool != last_pool:
                    target = _baseline_target(policy, setup, calib, pool, fast, blind) or plan
            if target is not None and set(pool).issuperset(
                    g for sp in target.stages for g in sp.gpus):
                break
            nxt = _next_change_s(traces, t_s)
            if nxt is None:
                raise ConfigError("gpu_traces", f"t={t_s:.0f} s",
                                  f"{policy}: no plan on the pool for the rest of the traces")
            waited += nxt - t_s
            t_s = nxt
            last_pool = pool
        event, trans_s = "", 0.0
        if target is not None and target != plan:
            if plan is None:
                event = "initial"
            else:
                planned = plan_change(setup, plan, target, pool, calib)  # as the controller
                if planned.executor == "restart":
                    trans_s, event = restart_cost, "restart"
                else:
                    trans_s, event = planned.cost_s, "transition"
            plan = target
        assert plan is not None
        cost = evaluate_plan(setup, plan, calib)
        if cost.over_capacity:  # a vendor-blind plan out of memory on the smaller type
            event, restarts = "oom", restarts + 1
            trans_s += restart_cost
            plan = search_plan(setup, calib, pool).plan
            cost = evaluate_plan(setup, plan, calib)
        if event in ("transition", "restart"):
            transitions += 1
            restarts += event == "restart"
        total_trans += trans_s
        by_type = tuple((t.name, sum(1 for g in pool if cl.gpu_of(g) == t)) for t in cl.types)
        records.append(MixedStep(step, t_s, by_type, cost.step_s, trans_s, event,
                                 plan_label(plan), waited))
        wait_total += waited
        t_s += trans_s + cost.step_s
        last_pool = pool
    total = sum(r.step_s for r in records) + total_trans
    return MixedResult(policy, steps, total / steps, total, transitions, total_trans, restarts,
                       tuple(records), wait_total)
