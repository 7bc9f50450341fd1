"""The per-component migration baselines in the same harness (the exact scheduler is :mod:`exact`).

Both plan each model-stage's migration alone (:func:`per_component_dag`) and differ in how they
run it:

- *sequential* (:func:`peer_sequential`, what a peer framework runs: verl's and Megatron's
  resharding move one model at a time): the model-stages migrate one after the other in stage
  order (gen → inf → train, then by name), each running its own migration
  release-before-acquire (its Destroys before its Extends, wherever its own data dependencies
  allow) with its primitives concurrent where its own dependencies allow; nothing of another
  model-stage runs meanwhile. It fails when a model-stage's turn comes and a GPU it must acquire
  is still held by a model-stage that migrates later (or its buffers do not fit): the run stops
  there, as a peer's reshard would.
- *independent controllers* (:func:`per_component_simulate`, DynaRL-style): every model-stage
  runs its own local DAG alone — no resource edges, no global order. Its controller starts at
  its launch time and runs its primitives one at a time in an order of its own (a random linear
  extension of its local DAG); an Extend acquires its target GPUs one by one as they become
  free and holds them while it waits for the rest (hold-and-wait). Components that wait on each
  other never progress: the run fails at the timeout.

Its plan is its own: :func:`per_component_dag` compiles each model-stage's migration alone, as
if no other model-stage existed (no GPU another one holds is known to it, no resource edge), and
puts the local DAGs side by side; nothing of our global compiler is consulted.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nereus.emu.primitives import Destroy, Extend, StateSizer, consumed, produced
from nereus.emu.unit import Emu
from nereus.errors import TransitionError
from nereus.transition.dag import TransitionDag
from nereus.transition.graph import default_stage_rank
from nereus.transition.reference.compile import compile_transition
from nereus.transition.schedule import simulate


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


def peer_sequential(pc: TransitionDag, stage_rank: Mapping[str, int] | None = None
                    ) -> TransitionDag:
    """``pc`` (:func:`per_component_dag`) as a peer runs it: model-stages one after the other
    (``stage_rank``, default gen → inf → train, then by name), each release-before-acquire —
    an Extend that copies a unit its own model-stage then destroys copies a replica that stays
    instead (when there is one), and each of its Destroys precedes each of its Extends that it
    does not depend on — and every primitive of a model-stage after every primitive of the one
    before."""
    rank = stage_rank or {}
    prims = list(pc.primitives)
    edges = set(pc.edges)
    made: dict[Emu, int] = dict.fromkeys(pc.source, -1)
    eaten: set[Emu] = set()
    for i, p in enumerate(prims):
        for u in produced(p):
            made[u] = i
        eaten |= set(consumed(p))
    kept = [(u, j) for u, j in made.items() if u not in eaten]

    def reaches(a: int, b: int) -> bool:
        succs: dict[int, list[int]] = {}
        for x, y, _ in edges:
            succs.setdefault(x, []).append(y)
        seen, todo = {a}, [a]
        while todo:
            for j in succs.get(todo.pop(), ()):
                if j == b:
                    return True
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        return False

    for i, p in enumerate(prims):  # copy from a replica that stays, not from one to be freed
        if not isinstance(p, Extend) or p.src not in eaten:
            continue
        stay = next(((u, j) for u, j in kept if u.model_stage == p.model_stage
                     and u.state == p.src.state and u.layout == p.src.layout
                     and not set(u.gpus) & set(p.new.gpus) and (j < 0 or not reaches(i, j))),
                    None)
        if stay is None:
            continue
        old_src = p.src
        prims[i] = Extend(stay[0], p.new, p.state_bytes, p.replicated_bytes)
        edges = {(a, b, k) for a, b, k in edges if not (a == i and k == "data"
                                                         and old_src in consumed(prims[b]))}
        if stay[1] >= 0:
            edges.add((stay[1], i, "data"))
    by_stage: dict[str, list[int]] = {}
    for i, p in enumerate(prims):
        by_stage.setdefault(p.model_stage, []).append(i)
    for idxs in by_stage.values():
        for d in (i for i in idxs if isinstance(prims[i], Destroy)):
            for e in (i for i in idxs if isinstance(prims[i], Extend)):
                if not reaches(e, d):
                    edges.add((d, e, "order"))
    names = sorted(by_stage, key=lambda m: (rank.get(m, default_stage_rank(m)), m))
    for before, after in itertools.pairwise(names):
        edges |= {(a, b, "resource") for a in by_stage[before] for b in by_stage[after]}
    order = tuple(i for m in names for i in by_stage[m])
    return TransitionDag(pc.source, pc.target, tuple(prims), tuple(sorted(edges)), order,
                         pc.t_sub, pc.conflicts, pc.state_bytes, pc.replicated_bytes)


def peer_sequential_run(
    pc: TransitionDag,
    durations_s: Sequence[float],
    *,
    launch_s: Mapping[str, float] | None = None,
    delay_s: Sequence[float] | None = None,
    capacity_bytes: int | Mapping[int, int] | None = None,
    timeout_s: float = float("inf"),
) -> BaselineRun:
    """Run ``pc`` as :func:`peer_sequential` orders it, on the runtime's scheduler core (a
    model-stage's primitives no earlier than its launch, each after its dispatch delay)."""
    seq = peer_sequential(pc)
    gate = [(launch_s or {}).get(p.model_stage, 0.0) for p in seq.primitives]
    try:
        res = simulate(seq, durations_s, delay_s=delay_s, not_before_s=gate,
                       capacity_bytes=capacity_bytes)
    except TransitionError as e:
        return BaselineRun(False, timeout_s, f"stuck: {e}")
    if res.makespan_s > timeout_s:
        return BaselineRun(False, timeout_s, "timeout")
    return BaselineRun(True, res.makespan_s)
