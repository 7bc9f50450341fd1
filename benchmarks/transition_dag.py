"""Global transition DAG: planning time and schedule quality, and deadlock-freedom under overlap.

(a) Planning: Llama-3.1-8B PPO (six model-stages, bf16 weights, fp32 Adam for the two trainers) on
H200 nodes of 8 GPUs, 32…1,024 GPUs, in two placements: "disjoint" (every model-stage on its own
GPUs; the target changes dp of four model-stages and tp/pp of four, with the block boundaries
shifting so that model-stages take over each other's GPUs) and "co-resident" (as the planner
places a synchronous workflow: each phase — gen, inf, train — spans the whole pool, model-stages
of one phase on disjoint GPUs, phases sharing GPUs; the conflict relation is
``Workflow.concurrent``). Ours = what the controller runs per replan (``plan_plans`` with
L̂_tran, the batched path): median wall and CPU time of cold repeats (each to a new target
plan object, after the untimed expansion of the one before) and the best CPU time; ``warm``:
back to back. Timed apart: the expansion to the per-primitive DAG, the reference compiler on
prebuilt units, and validation; ``same``: the expanded DAG and L̂_tran equal the reference's;
``plan %``: planning time as a share of the L̂_tran it plans (the goal: ≤ 1%). The exact
scheduler (:mod:`nereus.transition.exact`, CP-SAT, time-capped) orders the same primitives subject only to each model-stage's local edges, GPU ownership, one
primitive per GPU and model-stage, and memory at every instant — none of our resource, order or
memory edges. It runs twice per row with the same cap: once from our schedule as a hint (so it
is never worse than ours), once without (its own schedules only: what it finds alone, and
whether it finds any). gap = our simulated makespan vs. each run's best schedule; ``gap ≤`` =
ours vs. the better of the two proven lower bounds (where neither run is proven optimal, the
most ours can be off). Every schedule either run returns is checked against the rules by
:func:`~nereus.transition.schedule_check.check_schedule`, which shares no code with our
scheduler. The cap is wall time: on a loaded machine the solver gets less CPU (``exact_cpu_s``,
``free_cpu_s``: the CPU seconds its threads had).

(b) Overlap: 100 trials per overlap type with random placements of the current and target plans
(TP groups inside a node) and random launch timing (per model-stage start offset and per-primitive
dispatch latency). Targets are drawn without consulting our compiler: a target it rejects is our
failure, unless an exhaustive search of a relaxation (:mod:`nereus.transition.reachable`) proves
that no transition exists at all — then it is excluded from both methods and counted
(``excluded``). Two baselines plan each model-stage's migration alone
(:func:`~nereus.transition.baselines.per_component_dag`): the *peer* runs them the way verl's or
Megatron's resharding would (:func:`~nereus.transition.baselines.peer_sequential_run`: one
model-stage after the other in stage order, each release-before-acquire; it fails where a
model-stage's turn comes while a GPU it needs is still held by one that moves later, or its
buffers do not fit), and *independent controllers* run them concurrently, each in a random order
of its own with hold-and-wait GPU grabbing (a DynaRL-style straw man, built to deadlock); their
failures and ours are counted at the timeout. ``peer/ours``: the peer's time over ours on the
trials both complete. Mode "sim" here; mode "real" (8 MPI ranks, tiny Megatron models,
transfers over gloo) is benchmarks/transition_dag_real.py, added with ``--real N``.

    python benchmarks/transition_dag.py [--json] [--quick] [--exact-cap-s S]
        [--only planning|overlap] [--sizes 32,64] [--placements disjoint,co-resident]
    python benchmarks/transition_dag.py --plan-only disjoint 1024 10   # for a profiler
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import os
import random
import statistics
import sys
import time

from nereus.emu.primitives import StateSizer, model_state_sizer
from nereus.emu.unit import Emu, emus_of_plan
from nereus.errors import TransitionError
from nereus.spec.hardware import H200, ClusterSpec
from nereus.spec.model import LLAMA_3_1_8B
from nereus.spec.plan import ExecutionPlan, StagePlan
from nereus.spec.workflow import build_workflow
from nereus.transition.baselines import (
    peer_sequential_run,
    per_component_dag,
    per_component_simulate,
)
from nereus.transition.cost import durations_s, transition_cost_s
from nereus.transition.dag import TransitionDag
from nereus.transition.exact import exact_schedule
from nereus.transition.planned import plan_plans
from nereus.transition.reachable import min_gpus, reachable
from nereus.transition.reference.compile import compile_transition
from nereus.transition.residency import ConflictSpec
from nereus.transition.schedule import simulate
from nereus.transition.schedule_check import check_schedule
from nereus.transition.validate import validate_dag

GPN = 8
CAP = H200.memory_bytes
STATES = {"actor-gen": "actor", "ref-inf": "reference", "reward-inf": "reward",
          "critic-inf": "critic", "actor-train": "actor", "critic-train": "critic"}
SIZER = model_state_sizer({m: LLAMA_3_1_8B for m in STATES},
                          {m: m.endswith("-train") for m in STATES})
# (model-stage, sixteenths of the pool, tp, pp) in block order, current → target
PLAN_CUR = (("actor-gen", 4, 2, 1), ("ref-inf", 2, 1, 1), ("reward-inf", 2, 2, 1),
            ("critic-inf", 2, 1, 1), ("actor-train", 4, 4, 2), ("critic-train", 2, 4, 1))
PLAN_TGT = (("actor-gen", 6, 1, 1), ("ref-inf", 1, 2, 1), ("reward-inf", 1, 1, 1),
            ("critic-inf", 2, 2, 1), ("actor-train", 4, 8, 1), ("critic-train", 2, 2, 2))
# co-resident: per phase, (model-stage, sixteenths of the pool, tp, pp); every phase spans the pool
PHASES_CUR = ((("actor-gen", 16, 2, 1),),
              (("ref-inf", 4, 1, 1), ("reward-inf", 4, 2, 1), ("critic-inf", 8, 1, 1)),
              (("actor-train", 8, 4, 2), ("critic-train", 8, 4, 1)))
PHASES_TGT = ((("actor-gen", 16, 4, 1),),
              (("critic-inf", 8, 2, 1), ("reward-inf", 6, 1, 1), ("ref-inf", 2, 2, 1)),
              (("critic-train", 8, 2, 2), ("actor-train", 8, 8, 1)))
PPO = build_workflow("ppo", "sync", reward_model=True)
# overlap types: (name, GPUs, [(model-stage, GPUs, tp, pp) current], [... target])
OVERLAPS = (
    ("same-model cross-stage", 32,
     (("actor-gen", 16, 2, 1), ("actor-train", 16, 4, 2)),
     (("actor-gen", 8, 1, 1), ("actor-train", 24, 8, 1))),
    ("cross-model same-stage", 48,
     (("ref-inf", 16, 2, 1), ("reward-inf", 16, 4, 1), ("critic-inf", 16, 2, 2)),
     (("ref-inf", 8, 1, 1), ("reward-inf", 24, 2, 1), ("critic-inf", 16, 4, 1))),
    ("cross-model cross-stage", 48,
     (("actor-gen", 16, 2, 1), ("reward-inf", 16, 2, 1), ("critic-train", 16, 4, 2)),
     (("actor-gen", 24, 1, 1), ("reward-inf", 8, 4, 1), ("critic-train", 16, 8, 1))),
)
TIMEOUT_S = 60.0
LAUNCH_JITTER_S = 2.0
DISPATCH_JITTER_S = 0.2
EXACT_WORKERS = 2  # CP-SAT search threads (the machine has 2 cores)


def _block_plan(n: int, spec: tuple[tuple[str, int, int, int], ...]) -> ExecutionPlan:
    stages, off = [], 0
    for name, sixteenths, tp, pp in spec:
        size = n * sixteenths // 16
        reps = tuple(tuple(range(off + r * tp * pp, off + (r + 1) * tp * pp))
                     for r in range(size // (tp * pp)))
        stages.append(StagePlan(name, tp, pp, len(reps), 1, 1, replicas=reps))
        off += size
    return ExecutionPlan(tuple(stages))


def _phase_plan(n: int, phases: tuple[tuple[tuple[str, int, int, int], ...], ...]
                ) -> ExecutionPlan:
    """Each phase laid out in blocks from GPU 0: phases share GPUs, a phase's stages do not."""
    stages = []
    for phase in phases:
        stages += list(_block_plan(n, phase).stages)
    return ExecutionPlan(tuple(sorted(stages, key=lambda sp: PPO.names.index(sp.name))))


def _random_plan(rng: random.Random, n: int, spec: tuple[tuple[str, int, int, int], ...]
                 ) -> ExecutionPlan:
    """Random placement: each pipeline stage's TP group inside one node, nodes drawn at random."""
    free = {node: list(range(node * GPN, (node + 1) * GPN)) for node in range(n // GPN)}
    for gpus in free.values():
        rng.shuffle(gpus)
    groups = [(tp, k, r, s) for k, (_, size, tp, pp) in enumerate(spec)
              for r in range(size // (tp * pp)) for s in range(pp)]
    rng.shuffle(groups)
    groups.sort(key=lambda g: -g[0])  # widest TP groups first: no node is left fragmented
    placed: dict[tuple[int, int, int], list[int]] = {}
    for tp, k, r, s in groups:
        node = rng.choice([nd for nd, g in free.items() if len(g) >= tp])
        placed[(k, r, s)] = sorted(free[node][:tp])
        del free[node][:tp]
    stages = []
    for k, (name, size, tp, pp) in enumerate(spec):
        reps = tuple(tuple(g for s in range(pp) for g in placed[(k, r, s)])
                     for r in range(size // (tp * pp)))
        stages.append(StagePlan(name, tp, pp, len(reps), 1, 1, replicas=reps))
    return ExecutionPlan(tuple(stages))


def _median(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def planning_rows(sizes: list[int], exact_cap_s: float, repeats: int,
                  placements: tuple[str, ...] = ("disjoint", "co-resident")
                  ) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for placement in placements:
        for n in sizes:
            rows.append(_planning_row(placement, n, exact_cap_s, repeats))
    return rows


def _planning_row(placement: str, n: int, exact_cap_s: float, repeats: int) -> dict[str, object]:
    cluster = ClusterSpec(n // GPN, GPN, H200)
    cur, tgt, conflicts = _plans(placement, n)
    src, dst = emus_of_plan(cur, STATES), emus_of_plan(tgt, STATES)
    wall: list[float] = []
    cpu: list[float] = []
    parts: list[tuple[float, float]] = []
    for _ in range(repeats):
        target = _fresh(tgt)  # a new target each time, as the plan search makes one
        w0, c0 = time.perf_counter(), time.process_time()
        planned = plan_plans(cur, target, STATES, SIZER, cluster, capacity_bytes=CAP,
                             conflicts=conflicts)  # with L̂_tran
        cost_s = planned.cost_s
        w2, c2 = time.perf_counter(), time.process_time()
        dag = planned.dag  # built only for the transition that is executed
        w3 = time.perf_counter()
        wall.append(w2 - w0)
        cpu.append(c2 - c0)
        parts.append((w2 - w0, w3 - w2))
    # back to back (warm caches: the controller weighs its options one after the other)
    warm: list[float] = []
    targets = [_fresh(tgt) for _ in range(repeats)]
    for target in targets:
        c0 = time.process_time()
        plan_plans(cur, target, STATES, SIZER, cluster, capacity_bytes=CAP, conflicts=conflicts)
        warm.append(time.process_time() - c0)
    # the reference compiler in the same minutes (units built beforehand, as it takes them)
    ref_cpu: list[float] = []
    for _ in range(max(2, repeats // 4)):
        c0 = time.process_time()
        ref = compile_transition(src, dst, SIZER, capacity_bytes=CAP, conflicts=conflicts)
        ref_cost = transition_cost_s(ref, cluster)
        ref_cpu.append(time.process_time() - c0)
    same = dag == ref and cost_s == ref_cost
    w0 = time.perf_counter()
    validate_dag(dag, capacity_bytes=CAP, sizer=SIZER)
    validate_ms = (time.perf_counter() - w0) * 1e3
    dur = durations_s(dag, cluster)
    sim = simulate(dag, dur, capacity_bytes=CAP).makespan_s
    t0, c0 = time.perf_counter(), time.process_time()
    ex = exact_schedule(dag, dur, capacity_bytes=CAP, time_limit_s=exact_cap_s,
                        workers=EXACT_WORKERS)
    exact_ms = (time.perf_counter() - t0) * 1e3
    exact_cpu_s = time.process_time() - c0  # the solver's threads: what the load left it
    found = ex.makespan_s == ex.makespan_s
    # the same solver left to find its own schedules: no hint, the same cap
    t0, c0 = time.perf_counter(), time.process_time()
    free = exact_schedule(dag, dur, capacity_bytes=CAP, time_limit_s=exact_cap_s,
                          workers=EXACT_WORKERS, hint=False)
    free_ms = (time.perf_counter() - t0) * 1e3
    free_cpu_s = time.process_time() - c0
    free_found = free.makespan_s == free.makespan_s
    ours_ticks_s = ex.hint_s  # ours in the solver's ticks
    # the best lower bound either run proved; ours against it, and against the hint-free best
    bounds = [b for b in (ex.bound_s, free.bound_s) if b == b and b != float("inf")]
    bound = max(bounds) if bounds else float("nan")
    gap = (ours_ticks_s - ex.makespan_s) / ex.makespan_s * 100 if found else None
    gap_free = (ours_ticks_s - free.makespan_s) / free.makespan_s * 100 if free_found else None
    gap_bound = (ours_ticks_s - bound) / bound * 100 if bound > 0 else None
    valid = found and not check_schedule(dag, ex.durations, ex.start, capacity_bytes=CAP)
    free_valid = free_found and not check_schedule(dag, free.durations, free.start,
                                                   capacity_bytes=CAP)
    return {
        "placement": placement, "gpus": n, "primitives": len(dag.primitives),
        "resource_edges": len(dag.resource_edges),
        "memory_edges": sum(kind == "memory" for _, _, kind in dag.edges),
        "batched": planned.batched is not None,
        "same_as_reference": same,
        "ours_ms": round(_median(wall), 3), "ours_cpu_ms": round(_median(cpu), 3),
        "ours_cpu_best_ms": round(min(cpu) * 1e3, 3),
        "ours_warm_ms": round(_median(warm), 3),
        "plan_ms": round(_median([p[0] for p in parts]), 3),  # plan and L̂_tran (wall)
        "expand_ms": round(_median([p[1] for p in parts]), 3),
        "reference_cpu_ms": round(_median(ref_cpu), 3),
        "reference_cpu_best_ms": round(min(ref_cpu) * 1e3, 3),
        "validate_ms": round(validate_ms, 3),
        "plan_pct_of_tran": round(_median([p[0] for p in parts]) / (cost_s * 1e3) * 100, 4),
        "exact_cap_s": exact_cap_s,
        "exact_ms": round(exact_ms, 1), "exact_cpu_s": round(exact_cpu_s, 1),
        "free_cpu_s": round(free_cpu_s, 1), "exact_optimal": ex.optimal, "exact_status": ex.status,
        "exact_valid": valid,
        "cost_s": round(cost_s, 4), "ours_makespan_s": round(sim, 4),
        "exact_makespan_s": round(ex.makespan_s, 4) if found else None,
        "exact_bound_s": round(ex.bound_s, 4) if ex.bound_s == ex.bound_s else None,
        "gap_pct": None if gap is None else round(gap, 2),
        "free_ms": round(free_ms, 1), "free_status": free.status, "free_optimal": free.optimal,
        "free_valid": free_valid,
        "free_makespan_s": round(free.makespan_s, 4) if free_found else None,
        "free_bound_s": round(free.bound_s, 4) if free.bound_s == free.bound_s else None,
        "gap_free_pct": None if gap_free is None else round(gap_free, 2),
        "bound_s": round(bound, 4) if bound == bound else None,
        "gap_to_bound_pct": None if gap_bound is None else round(gap_bound, 2),
    }


def _plans(placement: str, n: int) -> tuple[ExecutionPlan, ExecutionPlan, ConflictSpec]:
    if placement == "disjoint":
        return _block_plan(n, PLAN_CUR), _block_plan(n, PLAN_TGT), None
    return _phase_plan(n, PHASES_CUR), _phase_plan(n, PHASES_TGT), PPO.concurrent


def _fresh(plan: ExecutionPlan) -> ExecutionPlan:
    """An equal plan of new objects (the planner reads a plan's replica tuples once per plan
    object: the controller's current plan was the target of the last transition, and each
    candidate target is new)."""
    return ExecutionPlan(tuple(dataclasses.replace(sp) for sp in plan.stages))


def plan_only(placement: str, n: int, reps: int) -> None:
    """``reps`` plannings (plan + cost) and nothing else, each one call of ``starmap``'s
    ``__next__``: for an external profiler (e.g. callgrind with collection toggled on
    ``starmap_next``, whose instruction count does not depend on the machine's load)."""
    cluster = ClusterSpec(n // GPN, GPN, H200)
    cur, tgt, conflicts = _plans(placement, n)

    def once(target: ExecutionPlan) -> float:
        return plan_plans(cur, target, STATES, SIZER, cluster, capacity_bytes=CAP,
                          conflicts=conflicts).cost_s

    once(_fresh(tgt))
    targets = [(_fresh(tgt),) for _ in range(reps)]
    collections.deque(itertools.starmap(once, targets), maxlen=0)


@dataclasses.dataclass(frozen=True)
class Trial:
    """One drawn overlap target: our DAG (None: our compiler rejected it, ``why``), whether no
    transition exists at all (``infeasible``: proven by :func:`reachable`; then the trial is
    excluded from both methods) and the per-component baseline's own plan (None: it cannot plan
    it, ``pc_why``)."""

    dag: TransitionDag | None
    why: str
    infeasible: bool
    pc_dag: TransitionDag | None
    pc_why: str


def draw_trial(src: tuple[Emu, ...], dst: tuple[Emu, ...], sizer: StateSizer, capacity: int,
               pool: range) -> Trial:
    """Plan a drawn target with both methods, neither consulting the other."""
    dag: TransitionDag | None = None
    why, infeasible = "", False
    try:
        dag = compile_transition(src, dst, sizer, capacity_bytes=capacity)
        validate_dag(dag, capacity_bytes=capacity, sizer=sizer)
    except TransitionError as e:
        dag, why = None, str(e)
        names = {u.model_stage for u in src}
        infeasible = reachable(src, dst, pool, {m: min_gpus(sizer(m), capacity)
                                                 for m in names}) is False
    pc: TransitionDag | None = None
    pc_why = ""
    if not infeasible:
        try:
            pc = per_component_dag(src, dst, sizer, capacity_bytes=capacity)
        except TransitionError as e:
            pc_why = str(e)
    return Trial(dag, why, infeasible, pc, pc_why)


def rejection_kind(why: str) -> str:
    """A short class of our compiler's reason for rejecting a target."""
    if "capacity" in why:
        return "memory"
    if why.startswith("circular wait"):
        return "circular wait"
    return why.split(":")[0][:40]


def overlap_rows(trials: int, seed: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for k, (name, n, cur, tgt) in enumerate(OVERLAPS):
        rng = random.Random(seed + k)
        cluster = ClusterSpec(n // GPN, GPN, H200)
        ours_ok = base_ok = peer_ok = excluded = rejected = unplanned = 0
        ours_t: list[float] = []
        base_t: list[float] = []
        peer_t: list[float] = []
        both_t: list[tuple[float, float]] = []  # (ours, peer) where both succeeded
        edges: list[int] = []
        reasons: collections.Counter[str] = collections.Counter()
        for _ in range(trials):
            src = emus_of_plan(_random_plan(rng, n, cur), STATES)
            dst = emus_of_plan(_random_plan(rng, n, tgt), STATES)
            trial = draw_trial(src, dst, SIZER, CAP, range(n))
            names = sorted({u.model_stage for u in src})
            launch = {m: rng.uniform(0, LAUNCH_JITTER_S) for m in names}
            if trial.infeasible:
                excluded += 1
                continue
            if trial.dag is None:  # our compiler's miss: our failure
                rejected += 1
                reasons[rejection_kind(trial.why)] += 1
                ours_t.append(TIMEOUT_S)
            else:
                dag = trial.dag
                dur = durations_s(dag, cluster)
                jitter = [rng.uniform(0, DISPATCH_JITTER_S) for _ in dag.primitives]
                # ours: the same launch offsets, as each primitive's earliest start
                gate = [launch[p.model_stage] for p in dag.primitives]
                try:
                    res = simulate(dag, dur, delay_s=jitter, not_before_s=gate,
                                   capacity_bytes=CAP)
                    ours_ok += res.makespan_s <= TIMEOUT_S
                    ours_t.append(min(res.makespan_s, TIMEOUT_S))
                except TransitionError:
                    ours_t.append(TIMEOUT_S)
                edges.append(len(dag.resource_edges))
            if trial.pc_dag is None:
                unplanned += 1
                base_t.append(TIMEOUT_S)
                peer_t.append(TIMEOUT_S)
                continue
            pc = trial.pc_dag
            pc_dur = durations_s(pc, cluster)
            pc_jitter = [rng.uniform(0, DISPATCH_JITTER_S) for _ in pc.primitives]
            # the peer's sequential migration: the same plan, launch offsets and dispatch latency
            p = peer_sequential_run(pc, pc_dur, launch_s=launch, delay_s=pc_jitter,
                                    capacity_bytes=CAP, timeout_s=TIMEOUT_S)
            peer_ok += p.success
            peer_t.append(p.time_s)
            if p.success and trial.dag is not None and ours_t[-1] < TIMEOUT_S:
                both_t.append((ours_t[-1], p.time_s))
            b = per_component_simulate(pc, pc_dur, launch_s=launch, delay_s=pc_jitter,
                                       timeout_s=TIMEOUT_S, rng=rng)
            base_ok += b.success
            base_t.append(b.time_s)
        ran = trials - excluded
        rows.append({
            "type": name, "mode": "sim", "gpus": n, "trials": trials, "excluded": excluded,
            "ours_rejected": rejected, "baseline_unplanned": unplanned,
            "ours_success_pct": round(100 * ours_ok / ran, 1) if ran else None,
            "baseline_success_pct": round(100 * base_ok / ran, 1) if ran else None,
            "peer_success_pct": round(100 * peer_ok / ran, 1) if ran else None,
            "ours_s": round(statistics.mean(ours_t), 3) if ours_t else None,
            "baseline_s": round(statistics.mean(base_t), 3) if base_t else None,
            "peer_s": round(statistics.mean(peer_t), 3) if peer_t else None,
            # where both succeeded: mean seconds of each and the peer's time over ours
            "both_ok": len(both_t),
            "both_ours_s": round(statistics.mean(o for o, _ in both_t), 3) if both_t else None,
            "both_peer_s": round(statistics.mean(q for _, q in both_t), 3) if both_t else None,
            "peer_over_ours": round(statistics.mean(q / o for o, q in both_t), 2)
            if both_t else None,
            "edges": round(statistics.mean(edges), 2) if edges else None,
            "rejections": dict(reasons),
        })
    return rows


def _cols(spec: str) -> tuple[tuple[str, str, int], ...]:
    """``header:key:width ...`` (``_`` in a header prints as a space)."""
    return tuple((h, k, int(w)) for h, k, w in (c.split(":") for c in spec.split()))


PLANNING_COLUMNS = _cols(
    "placement:placement:-12 GPUs:gpus:5 prims:primitives:6 res.:resource_edges:5 "
    "mem.:memory_edges:5 same:same_as_reference:5 ours_ms:ours_ms:8 cpu_ms:ours_cpu_ms:7 "
    "best:ours_cpu_best_ms:7 warm:ours_warm_ms:7 expand:expand_ms:7 ref_cpu:reference_cpu_ms:8 "
    "plan_%:plan_pct_of_tran:7 L_tran_s:cost_s:9 ours_s:ours_makespan_s:8 |hint_ms:exact_ms:9 "
    "status:exact_status:9 ok:exact_valid:5 s:exact_makespan_s:7 bound:exact_bound_s:7 "
    "gap_%:gap_pct:6 |free_ms:free_ms:9 status:free_status:9 ok:free_valid:5 "
    "s:free_makespan_s:7 bound:free_bound_s:7 gap_%:gap_free_pct:6 |bound_s:bound_s:9 "
    "gap_<=:gap_to_bound_pct:7")
OVERLAP_COLUMNS = _cols(
    "overlap_type:type:-26 mode:mode:4 trials:trials:6 excl.:excluded:5 "
    "ours_%:ours_success_pct:7 peer_%:peer_success_pct:7 indep._%:baseline_success_pct:8 "
    "ours_s:ours_s:7 peer_s:peer_s:7 indep._s:baseline_s:8 both:both_ok:5 "
    "peer/ours:peer_over_ours:9 edges:edges:6 rejected:ours_rejected:8 "
    "unplanned:baseline_unplanned:9")


def _table(rows: list[dict[str, object]], cols: tuple[tuple[str, str, int], ...]) -> None:
    """Rows as a text table (a negative width: left-aligned)."""
    def cell(text: object, w: int) -> str:
        return f"{text!s:<{-w}}" if w < 0 else f"{text!s:>{w}}"

    print(" ".join(cell(h.replace("_", " "), w) for h, _, w in cols))
    for r in rows:
        print(" ".join(cell(r.get(k), w) for _, k, w in cols))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer sizes and trials")
    ap.add_argument("--exact-cap-s", type=float, default=30.0,
                    help="solver time per exact run (each planning row runs it twice: with our "
                         "schedule as a hint, and without)")
    ap.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",")], default=None,
                    metavar="N,N,...", help="planning rows at these GPU counts only")
    ap.add_argument("--placements", default="disjoint,co-resident",
                    help="planning rows of these placements only (comma-separated)")
    ap.add_argument("--only", choices=("planning", "overlap"), default=None,
                    help="run one part only")
    ap.add_argument("--plan-only", nargs=3, metavar=("PLACEMENT", "GPUS", "REPS"),
                    help="only REPS plannings, for an external profiler (see plan_only)")
    ap.add_argument("--real", type=int, default=0, metavar="N",
                    help="also N trials per type executed on 8 CPU ranks (minutes per trial "
                         "under load; 0: skip)")
    args = ap.parse_args()
    if args.plan_only:
        plan_only(args.plan_only[0], int(args.plan_only[1]), int(args.plan_only[2]))
        return 0
    sizes = args.sizes or ([32, 128] if args.quick else [32, 64, 128, 256, 512, 1024])
    placements = tuple(args.placements.split(","))
    planning = [] if args.only == "overlap" else planning_rows(
        sizes, args.exact_cap_s, 5 if args.quick else 21, placements)
    overlap = [] if args.only == "planning" else overlap_rows(10 if args.quick else 100,
                                                              20261201)
    if args.real:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from transition_dag_real import real_rows

        overlap += real_rows(args.real)
    note = ("" if args.real else "overlap mode 'real' (8 CPU ranks) skipped: pass --real N")
    out = {"planning": planning, "overlap": overlap, "note": note}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    _table(planning, PLANNING_COLUMNS)
    print()
    _table(overlap, OVERLAP_COLUMNS)
    if note:
        print("\n" + note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
