"""What every schedule of a transition's primitives must respect, read off the primitives alone.

The exact scheduler (:mod:`exact`) orders the primitives of a DAG subject only to these rules,
none of which is an edge our global compiler added:

- *local dependencies*: each model-stage's "data" and "local" edges (a unit exists before it is
  read or consumed; a unit is read before it is destroyed; a GPU a model-stage releases is
  released before that model-stage acquires it again);
- *GPU ownership*: a model-stage *occupies* a GPU from the start of the Extend that acquires it
  (or from the beginning, for a source unit) to the end of the Destroy that releases it (or to
  the end); occupancies of two model-stages that may not share a GPU (the DAG's conflict
  relation, :mod:`residency`) never overlap;
- *one primitive at a time* per GPU and model-stage (the durations of :mod:`cost` assume a
  primitive has its GPUs' links to itself; co-resident model-stages may overlap, as in
  :mod:`schedule`);
- *memory*: on every GPU, at every instant, the shards of the live units plus the buffers of
  the running primitives (a primitive's peak minus the shards of its inputs, as
  :class:`~nereus.transition.schedule.Scheduler` counts them) plus the reserved bytes fit the
  capacity. A unit lives from the end of the primitive that makes it (or the beginning) to the
  end of the one that consumes it (or the end).

:func:`nereus.transition.schedule_check.check_schedule` verifies a timed schedule against these
rules by interval arithmetic of its own (it shares no code with this module or :mod:`schedule`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nereus.emu.primitives import Destroy, Extend, consumed, produced, read_only
from nereus.emu.unit import Emu
from nereus.errors import TransitionError
from nereus.transition.dag import TransitionDag
from nereus.transition.residency import excess_gpus, raise_level

SEMANTIC_EDGES = ("data", "local")  # the edge kinds that are each model-stage's own dependencies


@dataclass(frozen=True)
class Occupancy:
    """``model_stage`` occupies ``gpu`` from the start of primitive ``acquire`` (-1: from the
    beginning) to the end of primitive ``release`` (-1: to the end)."""

    model_stage: str
    gpu: int
    acquire: int
    release: int


@dataclass(frozen=True)
class Residency:
    """``nbytes`` on ``gpu`` from the end of ``after`` (-1: the beginning) to the end of
    ``until`` (-1: the end), or — ``during`` — from the start to the end of primitive ``after``
    (its buffers)."""

    gpu: int
    nbytes: int
    after: int
    until: int
    during: bool = False


def semantic_edges(dag: TransitionDag) -> tuple[tuple[int, int], ...]:
    """The edges every schedule keeps: each model-stage's "data" and "local" edges."""
    return tuple(sorted({(a, b) for a, b, k in dag.edges if k in SEMANTIC_EDGES}))


def occupancies(dag: TransitionDag) -> list[Occupancy]:
    """Every (model-stage, GPU) occupancy interval, in the order of :attr:`TransitionDag.order`
    (a model-stage's acquisitions and releases of one GPU are ordered by its local edges)."""
    open_at: dict[tuple[str, int], int] = {}  # (model-stage, GPU) → acquiring primitive
    for u in dag.source:
        for g in u.gpus:
            open_at[(u.model_stage, g)] = -1
    out: list[Occupancy] = []
    for i in dag.order:
        p = dag.primitives[i]
        if isinstance(p, Extend):
            for g in p.new.gpus:
                key = (p.model_stage, g)
                if key in open_at:
                    raise TransitionError(f"primitive {i}: {p.model_stage} acquires GPU {g}, "
                                          "which it already occupies")
                open_at[key] = i
        elif isinstance(p, Destroy):
            for g in p.unit.gpus:
                key = (p.model_stage, g)
                if key not in open_at:
                    raise TransitionError(f"primitive {i}: {p.model_stage} releases GPU {g}, "
                                          "which it does not occupy")
                out.append(Occupancy(p.model_stage, g, open_at.pop(key), i))
    out += [Occupancy(m, g, a, -1) for (m, g), a in open_at.items()]
    return out


def buffers(dag: TransitionDag, i: int) -> dict[int, int]:
    """Bytes primitive ``i`` adds on each GPU while it runs: its peak minus its inputs' shards
    (never below zero)."""
    p = dag.primitives[i]
    out = dict(p.peak_bytes())
    for u in consumed(p) + read_only(p):
        b = dag.unit_bytes(u)
        for g in u.gpus:
            if g in out:
                out[g] -= b
    return {g: max(0, b) for g, b in out.items()}


def residencies(dag: TransitionDag, gpus: Sequence[int] | None = None) -> list[Residency]:
    """What holds bytes on each GPU of ``gpus`` (all when None) and when."""
    want = None if gpus is None else set(gpus)
    made: dict[Emu, int] = dict.fromkeys(dag.source, -1)
    ends: dict[Emu, int] = {}
    out: list[Residency] = []
    for i, p in enumerate(dag.primitives):
        for u in produced(p):
            made[u] = i
        for u in consumed(p):
            ends[u] = i
        for g, b in buffers(dag, i).items():
            if b and (want is None or g in want):
                out.append(Residency(g, b, i, i, True))
    for u, after in made.items():
        b = dag.unit_bytes(u)
        for g in u.gpus:
            if b and (want is None or g in want):
                out.append(Residency(g, b, after, ends.get(u, -1)))
    return out


def tight_gpus(dag: TransitionDag, capacity_bytes: int | Mapping[int, int] | None,
               reserved_bytes: Mapping[int, int] | None = None) -> list[int]:
    """GPUs where some schedule might exceed the capacity: those where the co-residency bound
    (:mod:`residency`: the largest sum over model-stages that may share the GPU of the most each
    holds there) does not fit. Elsewhere no order can break the memory rule."""
    if capacity_bytes is None:
        return []
    levels: dict[str, dict[int, int]] = {}
    for u in dag.source:
        raise_level(levels, u.model_stage, dict.fromkeys(u.gpus, dag.unit_bytes(u)))
    for p in dag.primitives:
        raise_level(levels, p.model_stage, p.peak_bytes())
        for u in produced(p):
            raise_level(levels, u.model_stage, dict.fromkeys(u.gpus, dag.unit_bytes(u)))
    return sorted({g for g, _ in excess_gpus(levels, dag.exclusion, capacity_bytes,
                                             reserved_bytes)})
