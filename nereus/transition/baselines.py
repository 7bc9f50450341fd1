"""Baselines in the same harness: per-component migration and an exact (MILP) scheduler.

Per-component (DynaRL-style): every model-stage runs its own local DAG alone — no resource edges,
no global order. Its controller starts at its launch time and runs its primitives one at a time in
an order of its own (a random linear extension of its local DAG); an Extend acquires its target
GPUs one by one as they become free and holds them while it waits for the rest (hold-and-wait).
Components that wait on each other never progress: the run fails at the timeout.

Exact: the same primitives with the same forced precedences (data, same-model and cross-model GPU
release) as a MILP minimizing the makespan, with no two primitives that touch one GPU
overlapping (co-resident model-stages of the DAG's conflict relation excepted); only the order of
Extends that read one source is left free. Solved by ``scipy.optimize.milp`` (HiGHS) under a time
cap.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nereus.emu.primitives import Destroy, Extend, produced
from nereus.transition.dag import TransitionDag


@dataclass(frozen=True)
class BaselineRun:
    success: bool
    time_s: float  # makespan, or the timeout when it failed
    reason: str = ""


def per_component_simulate(
    dag: TransitionDag,
    durations_s: Sequence[float],
    *,
    launch_s: Mapping[str, float],
    delay_s: Sequence[float] | None = None,
    timeout_s: float,
    rng: random.Random,
) -> BaselineRun:
    """Discrete-event run of independent per-model-stage migrations (see the module docstring)."""
    prims = dag.primitives
    n = len(prims)
    delay = list(delay_s) if delay_s is not None else [0.0] * n
    local_preds: list[set[int]] = [set() for _ in range(n)]
    for a, b, kind in dag.edges:
        if kind != "resource" and prims[a].model_stage == prims[b].model_stage:
            local_preds[b].add(a)
    comps: dict[str, list[int]] = {}
    for i, p in enumerate(prims):
        comps.setdefault(p.model_stage, []).append(i)
    order: dict[str, list[int]] = {}
    for m, idxs in comps.items():  # a random linear extension of the local DAG
        left, seq = set(idxs), []
        while left:
            ready = sorted(i for i in left if not (local_preds[i] & left))
            pick = rng.choice(ready)
            seq.append(pick)
            left.discard(pick)
        order[m] = seq
    excl = dag.exclusion
    owners: dict[int, set[str]] = {}  # GPU → model-stages holding (or grabbing) it
    for u in dag.source:
        for g in u.gpus:
            owners.setdefault(g, set()).add(u.model_stage)

    def grab(g: int, m: str) -> bool:
        """Take ``g`` for ``m`` unless a conflicting model-stage holds it (co-residents share)."""
        here = owners.setdefault(g, set())
        if any(excl.conflicts(m, x) for x in here):
            return m in here
        here.add(m)
        return True
    names = sorted(comps, key=lambda m: (launch_s.get(m, 0.0), m))
    pos = dict.fromkeys(comps, 0)
    launched: set[str] = set()
    waiting: dict[str, int] = {}  # component → the Extend it is acquiring GPUs for
    events: list[tuple[float, int, str, int]] = []  # (time, tie, kind, payload)
    for k, m in enumerate(names):
        events.append((launch_s.get(m, 0.0), k, "launch", k))
    heapq.heapify(events)
    tie = len(events)
    now = 0.0
    done = 0

    def try_start(m: str) -> None:
        nonlocal tie
        if m not in launched or pos[m] >= len(order[m]):
            return
        i = order[m][pos[m]]
        p = prims[i]
        if isinstance(p, Extend):
            got = [grab(g, m) for g in p.new.gpus]  # grab what is free, hold it, wait
            if not all(got):
                waiting[m] = i
                return
        waiting.pop(m, None)
        pos[m] += 1
        heapq.heappush(events, (now + delay[i] + durations_s[i], tie, "done", i))
        tie += 1

    while events:
        t, _, kind, payload = heapq.heappop(events)
        if t > timeout_s:
            return BaselineRun(False, timeout_s, "timeout")
        now = t
        if kind == "launch":
            launched.add(names[payload])
            try_start(names[payload])
            continue
        p = prims[payload]
        if isinstance(p, Destroy):
            for g in p.unit.gpus:
                owners[g].discard(p.model_stage)
        for u in produced(p):
            for g in u.gpus:
                owners.setdefault(g, set()).add(u.model_stage)
        done += 1
        try_start(p.model_stage)
        for m in list(waiting):
            try_start(m)
    if done == n:
        return BaselineRun(True, now)
    return BaselineRun(False, timeout_s,
                       "deadlock: " + ", ".join(sorted(waiting)) + " hold GPUs and wait")


@dataclass(frozen=True)
class ExactSchedule:
    makespan_s: float  # nan when no schedule was found in time
    optimal: bool
    status: str


def exact_makespan(
    dag: TransitionDag, durations_s: Sequence[float], *, time_limit_s: float = 10.0
) -> ExactSchedule:
    """Minimum makespan of the DAG's primitives by MILP (scipy/HiGHS), time-capped."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    n = len(dag.primitives)
    excl = dag.exclusion
    forced = [(a, b) for a, b, k in dag.edges if k != "order"]
    preds: list[list[int]] = [[] for _ in range(n)]
    for a, b in forced:
        preds[b].append(a)
    # ancestors over the forced edges, in the DAG's topological order
    anc = [0] * n
    for i in dag.order:
        acc = 0
        for j in preds[i]:
            acc |= anc[j] | (1 << j)
        anc[i] = acc
    touching: dict[int, list[int]] = {}
    for i, prim in enumerate(dag.primitives):
        for g in prim.busy_gpus:
            touching.setdefault(g, []).append(i)
    pairs: set[tuple[int, int]] = set()
    for idxs in touching.values():
        for x in range(len(idxs)):
            for y in range(x + 1, len(idxs)):
                a, b = idxs[x], idxs[y]
                if not (anc[b] >> a) & 1 and not (anc[a] >> b) & 1 and excl.exclusive(
                        dag.primitives[a].model_stage, dag.primitives[b].model_stage):
                    pairs.add((min(a, b), max(a, b)))
    pair_list = sorted(pairs)
    d = np.asarray(durations_s, dtype=float) * 1e3  # milliseconds: better scaled for HiGHS
    big = float(d.sum()) + 1.0
    nv = n + 1 + len(pair_list)  # starts, makespan, one binary per free pair
    rows: list[dict[int, float]] = []
    lo: list[float] = []
    for a, b in forced:  # S_b - S_a >= d_a
        rows.append({b: 1.0, a: -1.0})
        lo.append(d[a])
    for i in range(n):  # C - S_i >= d_i
        rows.append({n: 1.0, i: -1.0})
        lo.append(d[i])
    for k, (a, b) in enumerate(pair_list):
        y = n + 1 + k
        rows.append({b: 1.0, a: -1.0, y: -big})  # y=1: a before b
        lo.append(d[a] - big)
        rows.append({a: 1.0, b: -1.0, y: big})  # y=0: b before a
        lo.append(d[b])
    ri: list[int] = []
    ci: list[int] = []
    vals: list[float] = []
    for r, row in enumerate(rows):
        for c, v in row.items():
            ri.append(r)
            ci.append(c)
            vals.append(v)
    mat = coo_matrix((vals, (ri, ci)), shape=(len(rows), nv)).tocsr()
    cost = np.zeros(nv)
    cost[n] = 1.0
    integrality = np.zeros(nv)
    integrality[n + 1:] = 1
    ub = np.full(nv, big)
    ub[n + 1:] = 1.0
    cons = LinearConstraint(mat, np.asarray(lo), np.full(len(rows), np.inf))
    res = None
    for presolve in (True, False):  # HiGHS' presolve occasionally ends in a solve error
        res = milp(cost, constraints=cons, integrality=integrality,
                   bounds=Bounds(np.zeros(nv), ub),
                   options={"time_limit": time_limit_s, "disp": False, "presolve": presolve})
        if res.x is not None:
            break
    assert res is not None
    if res.x is None:
        return ExactSchedule(float("nan"), False, str(res.message))
    return ExactSchedule(float(res.x[n]) / 1e3, res.status == 0, str(res.message))
