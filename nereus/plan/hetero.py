"""Vendor-aware plans on clusters of several hardware types (issue 23; pure, deterministic).

Rules:

- A unit (one TP×PP group of a model-stage) lives on GPUs of one hardware type. Placement puts a
  replica of at most a node inside one node, and nodes have one type each; a larger replica (whole
  nodes) is checked (:func:`type_errors`) and a plan that breaks the rule is never returned.
- **Per-type plans.** Every assignment of the model-stages to hardware types (σ: model-stage →
  type with GPUs in the pool) is planned as one sub-problem per type — the model-stages σ gives
  that type, in the workflow's lanes and phases, on that type's GPUs, costed with that type's own
  spec and calibration (:func:`nereus.plan.search.search_plan` on :meth:`ClusterSpec.typed`) —
  and the job's critical path is taken over all of them. Sub-problems are cached by (type,
  model-stages), so ``types^stages`` assignments cost at most ``types · 2^stages`` searches.
  Each sub-problem minimizes its own part of the critical path: exact when the types' parts are
  serial or concurrent as a whole, a heuristic when one phase is split across types.
- **Weight sync.** A model-stage that reads a logical state trained on another type (actor-gen
  beside actor-train) pays for the copy each step (component ``weight_sync``): every replica
  receives the state's weights over the link between the types — the inter-node link of one
  vendor, the host transport's link class between vendors (``ClusterSpec.host_gbps``) — from as
  many senders as there are GPUs on the smaller side. (Co-located layouts pay no such term, as in
  the homogeneous model.)
- **DP replicas across types.** A spanning plan plans the whole job on the union of the types'
  GPUs as if every GPU were one base type, with the smallest memory of the types and the links
  between them (the host link between vendors); its units stay inside a node, hence a type, and
  it is re-costed per replica on its own type (:func:`stage_latency_mixed`: a model-stage takes
  as long as its slowest replica, and its gradient all-reduce crosses the slowest link). It is
  chosen only when that cost beats every per-type plan: replicas span types only where the
  cost model says the host-path gradient sync pays. Every base type is tried.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from nereus.cost.calibration import Calibration, default_calibration
from nereus.cost.latency import StageLatency, stage_latency, step_latency_s
from nereus.cost.memory import gpu_memory, memory_capacity_bytes, stage_memory
from nereus.errors import ConfigError, InfeasiblePlanError
from nereus.plan.search import PlanResult, search_plan
from nereus.spec.hardware import ClusterSpec, GpuSpec
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan, StagePlan
from nereus.spec.workflow import Workflow

# Assignments σ tried at most; beyond it only those keeping each lane on one type (and spanning).
MAX_ASSIGNMENTS = 4096


def sub_workflow(workflow: Workflow, names: Sequence[str]) -> Workflow:
    """The part of ``workflow`` that runs ``names``: its lanes and phases without the others."""
    keep = set(names)
    lanes = []
    for lane in workflow.lanes:
        phases = tuple(p for p in (tuple(n for n in ph if n in keep) for ph in lane) if p)
        if phases:
            lanes.append(phases)
    return Workflow(workflow.algorithm, workflow.mode,
                    tuple(ms for ms in workflow.model_stages if ms.name in keep), tuple(lanes))


def typed_setup(setup: Setup, gpu: GpuSpec) -> Setup:
    """The setup as if every node had ``gpu`` (same GPU ids): what costs units on that type."""
    return replace(setup, cluster=setup.cluster.typed(gpu))


def type_errors(cluster: ClusterSpec, plan: ExecutionPlan) -> list[str]:
    """Every unit of ``plan`` whose GPUs are of more than one hardware type."""
    out = []
    for sp in plan.stages:
        for r, rep in enumerate(sp.replicas):
            names = sorted({cluster.type_name(g) for g in rep})
            if len(names) > 1:
                out.append(f"{sp.name} replica {r} spans hardware types {', '.join(names)}")
    return out


def link_bps(cluster: ClusterSpec, a: GpuSpec, b: GpuSpec) -> float:
    """Nominal bytes/s between GPUs of types ``a`` and ``b`` on different nodes."""
    if a.plays != b.plays:
        return cluster.host_gbps * 1e9
    return min(a.inter_node_gbps, b.inter_node_gbps) * 1e9


def _slowest_link_view(cluster: ClusterSpec, gpu: GpuSpec, spanned: Sequence[GpuSpec]) -> GpuSpec:
    """``gpu`` with its inter-node link lowered to the slowest link among ``spanned`` types."""
    bps = min([gpu.inter_node_gbps * 1e9] + [link_bps(cluster, a, b) for a in spanned
                                              for b in spanned])
    return replace(gpu, inter_node_gbps=bps / 1e9)


def stage_latency_mixed(setup: Setup, sp: StagePlan, calib: Calibration) -> StageLatency:
    """A placed model-stage's latency on a mixed cluster: each type it uses costs the candidate
    with its own spec and calibration (the inter-node link lowered to the slowest link between
    the types it spans: its DP all-reduce and any pipeline boundary between nodes use it); the
    slowest type sets the time. A unit across types (never planned; a vendor-blind plan's) is
    costed the same way, pessimistically."""
    cl = setup.cluster
    ms = setup.job.workflow.by_name(sp.name)
    spanned = [t for t in cl.types if any(cl.gpu_of(g) == t for g in sp.gpus)]
    worst: StageLatency | None = None
    for t in spanned:
        view = _slowest_link_view(cl, t, spanned)
        lat = stage_latency(replace(setup, cluster=cl.typed(view)), ms, sp.candidate, calib)
        if worst is None or lat.total_s > worst.total_s:
            worst = lat
    assert worst is not None
    return worst


def weight_sync_s(setup: Setup, plan: ExecutionPlan) -> dict[str, float]:
    """Seconds per step to bring the trained weights to the model-stages that read them from
    another hardware type (module docstring), per reading model-stage."""
    cl = setup.cluster
    wf = setup.job.workflow
    out: dict[str, float] = {}
    for sp in plan.stages:
        ms = wf.by_name(sp.name)
        if ms.trainable:
            continue
        trainers = [o for o in plan.stages if wf.by_name(o.name).trainable
                    and wf.by_name(o.name).state == ms.state]
        if not trainers:
            continue
        src = {g for o in trainers for g in o.gpus}
        src_types = {cl.gpu_of(g) for g in src}
        far = [rep for rep in sp.replicas if cl.gpu_of(rep[0]) not in src_types]
        if not far:
            continue
        far_gpus = {g for rep in far for g in rep}
        bps = min(max(link_bps(cl, cl.gpu_of(rep[0]), s) for s in src_types) for rep in far)
        model = setup.job.model(ms.role)
        nbytes = len(far) * model.num_params() * setup.job.dtype_bytes
        out[sp.name] = nbytes / (min(len(src), len(far_gpus)) * bps)
    return out


@dataclass(frozen=True)
class MixedCost:
    """What a placed plan costs on a mixed cluster, per model-stage and per GPU."""

    step_s: float
    latencies: tuple[StageLatency, ...]  # workflow order, ``weight_sync`` included
    gpu_peak_bytes: tuple[tuple[int, int], ...]
    over_capacity: tuple[int, ...]  # GPUs whose peak exceeds their own type's capacity
    type_errors: tuple[str, ...]


def evaluate_plan(setup: Setup, plan: ExecutionPlan, calib: Calibration | None = None) -> MixedCost:
    """Cost any placed plan on the mixed cluster truthfully: each replica on its own type,
    links between types as they are, memory against each GPU's own capacity."""
    calib = calib if calib is not None else default_calibration()
    cl = setup.cluster
    sync = weight_sync_s(setup, plan)
    lats = []
    for sp in plan.stages:
        lat = stage_latency_mixed(setup, sp, calib)
        extra = sync.get(sp.name, 0.0)
        if extra:
            lat = StageLatency(lat.name, lat.total_s + extra, (*lat.components, ("weight_sync", extra)))
        lats.append(lat)
    peaks: dict[int, int] = {}
    for t in cl.types:
        mine = set(cl.gpus_of(t))
        for g, b in gpu_memory(typed_setup(setup, t), plan, calib).items():
            if g in mine:
                peaks[g] = b
    caps = {t.name: memory_capacity_bytes(typed_setup(setup, t)) for t in cl.types}
    over = tuple(g for g, b in sorted(peaks.items()) if b > caps[cl.type_name(g)])
    step = step_latency_s(setup.job.workflow, {x.name: x.total_s for x in lats})
    return MixedCost(step, tuple(lats), tuple(sorted(peaks.items())), over,
                     tuple(type_errors(cl, plan)))


def _assemble(setup: Setup, calib: Calibration, plan: ExecutionPlan, method: str,
              considered: int) -> PlanResult | None:
    """A PlanResult of a placed plan costed by :func:`evaluate_plan`; None if it breaks a rule."""
    cost = evaluate_plan(setup, plan, calib)
    if cost.over_capacity or cost.type_errors:
        return None
    cl = setup.cluster
    wf = setup.job.workflow
    mem = []
    for sp in plan.stages:
        t = cl.gpu_of(sp.gpus[0])
        mem.append((sp.name, stage_memory(typed_setup(setup, t), wf.by_name(sp.name),
                                          sp.candidate, calib)))
    peak_gpu = max(cost.gpu_peak_bytes, key=lambda x: (x[1], -x[0]))
    return PlanResult(
        plan=plan, predicted_step_s=cost.step_s, stage_latencies=cost.latencies,
        stage_memory=tuple(mem), gpu_peak_bytes=cost.gpu_peak_bytes,
        peak_memory_bytes=peak_gpu[1],
        capacity_bytes=memory_capacity_bytes(typed_setup(setup, cl.gpu_of(peak_gpu[0]))),
        candidates_considered=considered, method=method)


def _order(plan_stages: Mapping[str, StagePlan], wf: Workflow) -> ExecutionPlan:
    return ExecutionPlan(tuple(plan_stages[n] for n in wf.names))


def _assignments(wf: Workflow, ntypes: int) -> list[tuple[int, ...]]:
    """σ as a type index per model-stage (workflow order): all of them when few, else those that
    keep each lane on one type."""
    names = wf.names
    if ntypes ** len(names) <= MAX_ASSIGNMENTS:
        return list(itertools.product(range(ntypes), repeat=len(names)))
    out = []
    for per_lane in itertools.product(range(ntypes), repeat=len(wf.lanes)):
        out.append(tuple(per_lane[wf.lane_of(n)] for n in names))
    return out


def search_mixed(
    setup: Setup,
    calib: Calibration | None = None,
    pool: Sequence[int] | None = None,
    method: str = "dp",
    time_limit_s: float = 60.0,
    layouts: Mapping[str, tuple[int, ...]] | None = None,
) -> PlanResult:
    """The fastest vendor-aware plan on a mixed cluster (module docstring).

    Raises ``InfeasiblePlanError`` when no assignment of model-stages to types and no spanning
    plan fits, naming why the whole pool on each type alone fails."""
    calib = calib if calib is not None else default_calibration()
    cl = setup.cluster
    wf = setup.job.workflow
    n = cl.num_gpus
    if pool is None:
        pool_t = cl.all_gpus()
    else:
        for g in pool:
            if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < n:
                raise ConfigError("pool", g, f"GPU id must be an integer in [0, {n})")
        pool_t = tuple(sorted(set(pool)))
    if not pool_t:
        raise InfeasiblePlanError("the GPU pool is empty")
    types = [t for t in cl.types if any(cl.gpu_of(g) == t for g in pool_t)]
    pools = {t.name: tuple(g for g in pool_t if cl.gpu_of(g) == t) for t in types}
    solved: dict[tuple[str, tuple[str, ...]], PlanResult | str] = {}
    considered = 0

    def sub(t: GpuSpec, names: tuple[str, ...]) -> PlanResult | str:
        nonlocal considered
        key = (t.name, names)
        got = solved.get(key)
        if got is None:
            pins = {k: v for k, v in (layouts or {}).items() if k in names} or None
            try:
                got = search_plan(typed_setup(setup, t), calib, pools[t.name], method,
                                  time_limit_s, None, pins, sub_workflow(wf, names))
                considered += got.candidates_considered
            except InfeasiblePlanError as e:
                got = e.reason
            solved[key] = got
        return got

    best: tuple[float, int, PlanResult] | None = None
    rank = 0
    for sigma in _assignments(wf, len(types)):
        rank += 1
        stages: dict[str, StagePlan] = {}
        ok = True
        for ti, t in enumerate(types):
            names = tuple(nm for nm, s in zip(wf.names, sigma, strict=True) if s == ti)
            if not names:
                continue
            got = sub(t, names)
            if isinstance(got, str):
                ok = False
                break
            stages.update({sp.name: sp for sp in got.plan.stages})
        if not ok:
            continue
        res = _assemble(setup, calib, _order(stages, wf), method, considered)
        if res is not None and (best is None or res.predicted_step_s < best[0]):
            best = (res.predicted_step_s, rank, res)
    # Spanning plans: the whole job on the union, every type as the base in turn.
    if len(types) > 1:
        memory = min(t.memory_bytes for t in types)
        for t in types:
            base = replace(_slowest_link_view(cl, t, types), memory_bytes=memory)
            rank += 1
            try:
                got = search_plan(replace(setup, cluster=cl.typed(base)), calib, pool_t, method,
                                  time_limit_s, None, layouts)
            except InfeasiblePlanError:
                continue
            considered += got.candidates_considered
            res = _assemble(setup, calib, got.plan, method, considered)
            if res is not None and (best is None or res.predicted_step_s < best[0]):
                best = (res.predicted_step_s, rank, res)
    if best is None:
        reasons = "; ".join(f"{t.name} alone: {r}" for t in types
                            if isinstance(r := sub(t, wf.names), str))
        raise InfeasiblePlanError(
            "no vendor-aware plan fits the mixed pool (each unit on one hardware type)"
            + (f" — {reasons}" if reasons else ""))
    return replace(best[2], candidates_considered=considered)


@dataclass(frozen=True)
class TypeShare:
    """What one hardware type runs in a plan."""

    gpu: GpuSpec
    pool_gpus: int  # GPUs of this type in the pool (the cluster when no pool is given)
    used_gpus: tuple[int, ...]
    stages: tuple[str, ...]  # model-stages with a replica on this type


def placement_by_type(cluster: ClusterSpec, plan: ExecutionPlan,
                      pool: Sequence[int] | None = None) -> tuple[TypeShare, ...]:
    """Per hardware type: the GPUs a plan uses there and the model-stages it runs there."""
    pool_set = set(pool) if pool is not None else set(cluster.all_gpus())
    out = []
    for t in cluster.types:
        mine = set(cluster.gpus_of(t))
        used = tuple(sorted({g for sp in plan.stages for g in sp.gpus if g in mine}))
        names = tuple(sp.name for sp in plan.stages if any(g in mine for g in sp.gpus))
        out.append(TypeShare(t, len(mine & pool_set), used, names))
    return tuple(out)
