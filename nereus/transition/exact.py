"""Exact reference for scheduling a transition: the shortest schedule of its primitives under
the rules of :mod:`semantics` only, by constraint programming (OR-Tools CP-SAT), time-capped.

Optional: needs the ``nereus[solver]`` extra (``ortools``); the solver is imported inside
:func:`exact_schedule` only, so the pure core imports without it. None of our compiler's
"resource", "order" or "memory" edges constrain it: it may order every acquisition, every read
of a source and every primitive on a shared GPU as it likes, so it can beat our schedule
wherever those edges cost time.

The model, in integer ticks of :data:`TICK_S` (durations rounded to the nearest tick):

- an interval per primitive; ``end(a) <= start(b)`` for every local ("data"/"local") edge;
- per GPU and model-stage, the primitives keeping that GPU busy do not overlap;
- per GPU, the occupancy intervals (:func:`semantics.occupancies`) of model-stages that may
  not share it do not overlap (one no-overlap per GPU when no two model-stages may share any);
- per GPU where some order could exceed the memory (:func:`semantics.tight_gpus`), a cumulative
  constraint over the units' residencies and the primitives' buffers within the capacity less
  the reserved bytes;
- minimize the makespan.

Our own schedule (the runtime's scheduler on the full DAG) is given as a hint, so the solution
is never worse than ours; the solver's lower bound says how far from optimal both may be.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nereus.transition.dag import TransitionDag
from nereus.transition.semantics import (
    occupancies,
    residencies,
    semantic_edges,
    tight_gpus,
)

TICK_S = 1e-6  # the model's time unit: one microsecond


@dataclass(frozen=True)
class ExactSchedule:
    """The best schedule found and what the solver proved.

    ``makespan_s`` is that schedule's length (nan when none was found); ``bound_s`` the proven
    lower bound on any schedule; ``optimal`` whether the two meet; ``status`` the solver's
    (``OPTIMAL``, ``FEASIBLE``, ``INFEASIBLE``: no schedule exists, ``UNKNOWN``: none found in
    time); ``start`` the schedule's start ticks and ``durations`` the rounded durations (ticks)
    it was solved for."""

    makespan_s: float
    bound_s: float
    optimal: bool
    status: str
    start: tuple[int, ...] = ()
    durations: tuple[int, ...] = ()
    hint_s: float = float("nan")  # our schedule in the same ticks, given as the hint

    @property
    def infeasible(self) -> bool:
        return self.status == "INFEASIBLE"


def ticks(durations_s: Sequence[float]) -> list[int]:
    """Durations in ticks, rounded to the nearest (a schedule's length moves by at most half a
    tick per primitive on its critical path)."""
    return [round(d / TICK_S) for d in durations_s]


def exact_schedule(
    dag: TransitionDag,
    durations_s: Sequence[float],
    *,
    capacity_bytes: int | Mapping[int, int] | None = None,
    reserved_bytes: Mapping[int, int] | None = None,
    time_limit_s: float = 10.0,
    workers: int = 1,
    hint: bool = True,
    seed: int = 0,
) -> ExactSchedule:
    """The shortest schedule of ``dag``'s primitives under :mod:`semantics`, within
    ``time_limit_s`` of solver time (``workers`` search threads; ``seed`` fixes the search).

    ``hint``: start from our scheduler's schedule (the solution is then never longer). Without
    it the solver may also prove that no schedule exists (``status`` ``INFEASIBLE``)."""
    from ortools.sat.python import cp_model

    n = len(dag.primitives)
    dur = ticks(durations_s)
    if not n:
        return ExactSchedule(0.0, 0.0, True, "OPTIMAL", (), (), 0.0)
    hint_start: list[int] | None = None
    hint_len = float("nan")
    if hint:
        from nereus.transition.schedule import simulate

        sim = simulate(dag, [float(d) for d in dur], capacity_bytes=capacity_bytes,
                       reserved_bytes=reserved_bytes)
        hint_start = [round(s) for s in sim.start_s]
        hint_len = sim.makespan_s * TICK_S
    horizon = max(sum(dur), round(hint_len / TICK_S) if hint_start else 0) + 1
    m = cp_model.CpModel()
    start = [m.new_int_var(0, horizon, f"s{i}") for i in range(n)]
    end = [start[i] + dur[i] for i in range(n)]
    iv = [m.new_fixed_size_interval_var(start[i], dur[i], f"p{i}") for i in range(n)]
    span = m.new_int_var(0, horizon, "makespan")
    for i in range(n):
        m.add(span >= end[i])
    for a, b in semantic_edges(dag):
        m.add(start[b] >= end[a])
    prims = dag.primitives
    busy: dict[tuple[int, str], list[int]] = {}
    for i, p in enumerate(prims):
        for g in p.busy_gpus:
            busy.setdefault((g, p.model_stage), []).append(i)
    for idxs in busy.values():
        if len(idxs) > 1:
            m.add_no_overlap([iv[i] for i in idxs])

    def interval(after: int, until: int, during: bool, name: str) -> Any:
        """An interval from the start (``during``) or end of ``after`` (-1: 0) to the end of
        ``until`` (-1: the makespan)."""
        lo = 0 if after < 0 else (start[after] if during else end[after])
        hi = span if until < 0 else end[until]
        if after >= 0 and until >= 0 and during:
            return iv[after]
        size = m.new_int_var(0, horizon, f"{name}len")
        m.add(size == hi - lo)
        return m.new_interval_var(lo, size, hi, name)

    excl = dag.exclusion
    by_gpu: dict[int, list[tuple[str, Any]]] = {}
    for k, o in enumerate(occupancies(dag)):
        # acquire: from the Extend's start; release: to the Destroy's end
        lo = 0 if o.acquire < 0 else start[o.acquire]
        hi = span if o.release < 0 else end[o.release]
        size = m.new_int_var(0, horizon, f"o{k}len")
        m.add(size == hi - lo)
        by_gpu.setdefault(o.gpu, []).append((o.model_stage, m.new_interval_var(lo, size, hi,
                                                                                f"o{k}")))
    for occ in by_gpu.values():
        if len(occ) < 2:
            continue
        if excl.pairs is None:
            m.add_no_overlap([x for _, x in occ])
            continue
        for a in range(len(occ)):
            for b in range(a + 1, len(occ)):
                if excl.exclusive(occ[a][0], occ[b][0]):
                    m.add_no_overlap([occ[a][1], occ[b][1]])
    tight = tight_gpus(dag, capacity_bytes, reserved_bytes)
    if tight:
        assert capacity_bytes is not None
        reserved = reserved_bytes or {}
        per_gpu: dict[int, list[tuple[Any, int]]] = {}
        for k, r in enumerate(residencies(dag, tight)):
            per_gpu.setdefault(r.gpu, []).append(
                (interval(r.after, r.until, r.during, f"r{k}"), r.nbytes))
        for g, items in per_gpu.items():
            cap = capacity_bytes if isinstance(capacity_bytes, int) else capacity_bytes[g]
            m.add_cumulative([x for x, _ in items], [b for _, b in items],
                             cap - reserved.get(g, 0))
    m.minimize(span)
    if hint_start is not None:
        for i in range(n):
            m.add_hint(start[i], hint_start[i])
        m.add_hint(span, round(hint_len / TICK_S))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = max(1, int(workers))
    solver.parameters.random_seed = int(seed)
    code = solver.solve(m)
    status = solver.status_name(code)
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        got = tuple(int(solver.value(s)) for s in start)
        return ExactSchedule(solver.objective_value * TICK_S,
                             solver.best_objective_bound * TICK_S, code == cp_model.OPTIMAL,
                             status, got, tuple(dur), hint_len)
    bound = float("inf") if code == cp_model.INFEASIBLE else float("nan")
    return ExactSchedule(float("nan"), bound, False, status, (), tuple(dur), hint_len)
