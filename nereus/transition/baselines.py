"""The per-component migration baseline in the same harness (the exact scheduler is :mod:`exact`).

Per-component (DynaRL-style): every model-stage runs its own local DAG alone — no resource edges,
no global order. Its controller starts at its launch time and runs its primitives one at a time in
an order of its own (a random linear extension of its local DAG); an Extend acquires its target
GPUs one by one as they become free and holds them while it waits for the rest (hold-and-wait).
Components that wait on each other never progress: the run fails at the timeout.

Its plan is its own: :func:`per_component_dag` compiles each model-stage's migration alone, as
if no other model-stage existed (no GPU another one holds is known to it, no resource edge), and
puts the local DAGs side by side; nothing of our global compiler is consulted.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nereus.emu.primitives import Destroy, Extend, StateSizer, produced
from nereus.emu.unit import Emu
from nereus.errors import TransitionError
from nereus.transition.dag import TransitionDag
from nereus.transition.reference.compile import compile_transition


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


def per_component_dag(
    source: Sequence[Emu],
    target: Sequence[Emu],
    sizer: StateSizer,
    *,
    capacity_bytes: int | Mapping[int, int] | None = None,
) -> TransitionDag:
    """Each model-stage's migration planned alone (its source and target units only, the
    reference compiler's local DAG with no other model-stage in view), side by side in one DAG
    with no edge between model-stages. Raises TransitionError when some model-stage cannot plan
    its migration even alone (e.g. every copy sits on GPUs its own target needs)."""
    names = sorted({u.model_stage for u in source} | {v.model_stage for v in target})
    prims: list = []
    edges: list[tuple[int, int, str]] = []
    order: list[int] = []
    t_sub: list[tuple[str, int, int]] = []
    sizes: list[tuple[str, int]] = []
    for m in names:
        try:
            part = compile_transition([u for u in source if u.model_stage == m],
                                      [v for v in target if v.model_stage == m], sizer,
                                      capacity_bytes=capacity_bytes)
        except TransitionError as e:
            raise TransitionError(f"{m} alone: {e}") from e
        off = len(prims)
        prims += part.primitives
        edges += [(a + off, b + off, k) for a, b, k in part.edges]
        order += [i + off for i in part.order]
        t_sub += part.t_sub
        sizes += part.state_bytes
    return TransitionDag(tuple(source), tuple(target), tuple(prims), tuple(edges),
                         tuple(order), tuple(t_sub), None, tuple(sizes))
