"""An independent check of a timed schedule of a transition's primitives (pure).

Given start times and durations (integer ticks; primitive ``i`` runs over the half-open interval
``[start[i], start[i] + durations[i])``), every rule is checked by plain interval arithmetic over
those times, read off the primitive records and the DAG's data: this module shares no code with
the scheduler (:mod:`schedule`), the rules the exact scheduler is built from (:mod:`semantics`)
or the co-residency bound (:mod:`residency`). The rules (DESIGN.md §2.3, item 4):

- ``local edge``: each model-stage's own dependencies hold — the DAG's "data" and "local" edges,
  and, derived from the units themselves, a unit is made before it is read or consumed, read
  before it is consumed, consumed at most once, and the units alive at the end are the target;
- ``GPU ownership``: a model-stage occupies a GPU from the start of the Extend that acquires it
  (or from the beginning, for a GPU of a source unit) to the end of the Destroy that releases it
  (or to the end); it never acquires a GPU it occupies nor releases one it does not; the
  occupancies of two model-stages that may not share a GPU (the DAG's conflicting pairs; every
  two distinct model-stages when it has none) never overlap on a GPU;
- ``one primitive``: per GPU and model-stage, the primitives keeping that GPU busy never overlap;
- ``memory``: on every GPU, at every instant, the shards of the units alive there (from the end
  of the primitive that makes a unit, or the beginning, to the end of the one that consumes it,
  or the end) plus the buffers of the primitives running there (a primitive's peak on the GPU
  minus the shards of its inputs there, never below zero) plus the reserved bytes fit the
  capacity. The bytes on a GPU change only at the ends of these intervals, so checking at each
  interval's start covers every instant.

:func:`check_schedule` returns every violation found, each line starting with its rule's name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nereus.emu.primitives import Destroy, Extend, Merge, Primitive, Split
from nereus.emu.unit import Emu
from nereus.transition.dag import TransitionDag

RULES = ("local edge", "GPU ownership", "one primitive", "memory")
LOCAL_KINDS = ("data", "local")  # the DAG's edges that are a model-stage's own dependencies
END = float("inf")  # "to the end": after every primitive


def _inputs(p: Primitive) -> tuple[tuple[Emu, ...], tuple[Emu, ...]]:
    """(units ``p`` consumes, units it only reads)."""
    if isinstance(p, Split):
        return (p.src,), ()
    if isinstance(p, Merge):
        return p.srcs, ()
    if isinstance(p, Destroy):
        return (p.unit,), ()
    return (), (p.src,)


def _outputs(p: Primitive) -> tuple[Emu, ...]:
    if isinstance(p, Split):
        return p.into
    if isinstance(p, Merge):
        return (p.into,)
    if isinstance(p, Extend):
        return (p.new,)
    return ()


def _name(dag: TransitionDag, i: int) -> str:
    p = dag.primitives[i]
    return f"{type(p).__name__} #{i} of {p.model_stage}"


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two half-open intervals share an instant (an empty one shares none)."""
    return a[0] < a[1] and b[0] < b[1] and a[0] < b[1] and b[0] < a[1]


def _conflict(dag: TransitionDag, a: str, b: str) -> bool:
    if a == b:
        return False
    if dag.conflicts is None:
        return True
    return (a, b) in dag.conflicts or (b, a) in dag.conflicts


def check_schedule(
    dag: TransitionDag,
    durations: Sequence[int],
    start: Sequence[int],
    *,
    capacity_bytes: int | Mapping[int, int] | None = None,
    reserved_bytes: Mapping[int, int] | None = None,
) -> list[str]:
    """Every violation of the rules above by the schedule ``start`` of ``dag``'s primitives
    with ``durations`` (no memory rule without ``capacity_bytes``); empty when it is valid."""
    n = len(dag.primitives)
    if len(start) != n or len(durations) != n:
        return [f"schedule: {len(start)} starts and {len(durations)} durations for "
                f"{n} primitives"]
    bad = [f"schedule: {_name(dag, i)} has start {start[i]} and duration {durations[i]}"
           for i in range(n) if start[i] < 0 or durations[i] < 0]
    if bad:
        return bad
    end = [start[i] + durations[i] for i in range(n)]
    bad += _local(dag, start, end)
    bad += _ownership(dag, start, end)
    bad += _one_at_a_time(dag, start, end)
    if capacity_bytes is not None:
        bad += _memory(dag, start, end, capacity_bytes, reserved_bytes or {})
    return bad


def _lives(dag: TransitionDag) -> tuple[dict[Emu, int], dict[Emu, list[int]], dict[Emu, list[int]]]:
    """Per unit: the primitive that makes it (-1: a source unit), those that consume it and
    those that read it."""
    made: dict[Emu, int] = dict.fromkeys(dag.source, -1)
    eaten: dict[Emu, list[int]] = {}
    read: dict[Emu, list[int]] = {}
    for i, p in enumerate(dag.primitives):
        ins, reads = _inputs(p)
        for u in ins:
            eaten.setdefault(u, []).append(i)
        for u in reads:
            read.setdefault(u, []).append(i)
        for u in _outputs(p):
            made[u] = i
    return made, eaten, read


def _local(dag: TransitionDag, start: Sequence[int], end: Sequence[int]) -> list[str]:
    bad: list[str] = []
    for a, b, kind in dag.edges:
        if kind in LOCAL_KINDS and start[b] < end[a]:
            bad.append(f"local edge: {_name(dag, b)} starts at {start[b]}, before "
                       f"{_name(dag, a)} ends at {end[a]} ({kind} edge)")
    made, eaten, read = _lives(dag)
    for u in sorted(set(eaten) | set(read), key=repr):
        if u not in made:
            users = eaten.get(u, []) + read.get(u, [])
            bad.append(f"local edge: {_name(dag, users[0])} uses a unit nothing makes: {u}")
            continue
        since = 0 if made[u] < 0 else end[made[u]]
        for i in eaten.get(u, []) + read.get(u, []):
            if start[i] < since:
                bad.append(f"local edge: {_name(dag, i)} starts at {start[i]}, before its "
                           f"input {u} exists (at {since})")
        if len(eaten.get(u, [])) > 1:
            bad.append(f"local edge: {u} is consumed by {len(eaten[u])} primitives")
        for c in eaten.get(u, []):
            for r in read.get(u, []):
                if start[c] < end[r]:
                    bad.append(f"local edge: {_name(dag, c)} consumes {u} at {start[c]} while "
                               f"{_name(dag, r)} reads it until {end[r]}")
    alive = set(made) - set(eaten)
    if alive != set(dag.target):
        bad.append(f"local edge: the units alive at the end are not the target "
                   f"({len(alive - set(dag.target))} extra, "
                   f"{len(set(dag.target) - alive)} missing)")
    return bad


def _ownership(dag: TransitionDag, start: Sequence[int], end: Sequence[int]) -> list[str]:
    # per (model-stage, GPU): acquisitions (at an Extend's start) and releases (at a Destroy's end)
    events: dict[tuple[str, int], list[tuple[float, int, int]]] = {}
    for i, p in enumerate(dag.primitives):
        if isinstance(p, Extend):
            for g in p.new.gpus:
                events.setdefault((p.model_stage, g), []).append((start[i], 1, i))
        elif isinstance(p, Destroy):
            for g in p.unit.gpus:
                events.setdefault((p.model_stage, g), []).append((end[i], 0, i))
    held: dict[tuple[str, int], float] = {}
    for u in dag.source:
        for g in u.gpus:
            held[(u.model_stage, g)] = 0.0
    spans: dict[int, list[tuple[str, float, float]]] = {}  # GPU → (model-stage, from, to)
    bad: list[str] = []
    for key in sorted(set(events) | set(held)):
        ms, g = key
        since = held.get(key)
        for t, acquire, i in sorted(events.get(key, [])):  # releases first at one instant
            if acquire:
                if since is not None:
                    bad.append(f"GPU ownership: {_name(dag, i)} acquires GPU {g} at {t}, which "
                               f"{ms} occupies since {since}")
                    continue
                since = t
            else:
                if since is None:
                    bad.append(f"GPU ownership: {_name(dag, i)} releases GPU {g} at {t}, which "
                               f"{ms} does not occupy")
                    continue
                spans.setdefault(g, []).append((ms, since, t))
                since = None
        if since is not None:
            spans.setdefault(g, []).append((ms, since, END))
    for g, on in sorted(spans.items()):
        for k, (a, a0, a1) in enumerate(on):
            for b, b0, b1 in on[k + 1:]:
                if _conflict(dag, a, b) and _overlap((a0, a1), (b0, b1)):
                    bad.append(f"GPU ownership: {a} occupies GPU {g} over [{a0}, {a1}) and "
                               f"{b}, which may not share it, over [{b0}, {b1})")
    return bad


def _one_at_a_time(dag: TransitionDag, start: Sequence[int], end: Sequence[int]) -> list[str]:
    on: dict[tuple[int, str], list[int]] = {}
    for i, p in enumerate(dag.primitives):
        for g in p.busy_gpus:
            on.setdefault((g, p.model_stage), []).append(i)
    bad: list[str] = []
    for (g, _), idxs in sorted(on.items()):
        idxs = sorted(idxs, key=lambda i: (start[i], end[i]))
        for k, a in enumerate(idxs):
            for b in idxs[k + 1:]:
                if start[b] >= end[a]:
                    break  # sorted by start: no later one overlaps ``a``
                if _overlap((start[a], end[a]), (start[b], end[b])):
                    bad.append(f"one primitive: {_name(dag, a)} [{start[a]}, {end[a]}) and "
                               f"{_name(dag, b)} [{start[b]}, {end[b]}) both keep GPU {g} busy")
    return bad


def _memory(dag: TransitionDag, start: Sequence[int], end: Sequence[int],
            capacity_bytes: int | Mapping[int, int], reserved: Mapping[int, int]) -> list[str]:
    # per GPU: (from, to, bytes, what)
    spans: dict[int, list[tuple[float, float, int, str]]] = {}
    made, eaten, _read = _lives(dag)
    for u, by in made.items():
        b = dag.unit_bytes(u)
        since = 0 if by < 0 else end[by]
        until = end[eaten[u][0]] if u in eaten else END
        for g in u.gpus:
            spans.setdefault(g, []).append((since, until, b, f"{u.model_stage} unit"))
    for i, p in enumerate(dag.primitives):
        ins, reads = _inputs(p)
        for g, peak in p.peak_bytes().items():
            own = sum(dag.unit_bytes(u) for u in ins + reads if g in u.gpus)
            if peak - own > 0:
                spans.setdefault(g, []).append((start[i], end[i], peak - own, _name(dag, i)))
    bad: list[str] = []
    for g, on in sorted(spans.items()):
        cap = capacity_bytes if isinstance(capacity_bytes, int) else capacity_bytes[g]
        room = cap - reserved.get(g, 0)
        for t in sorted({s for s, e, _, _ in on if s < e}):
            held = [(b, what) for s, e, b, what in on if s <= t < e]
            total = sum(b for b, _ in held)
            if total > room:
                bad.append(f"memory: GPU {g} holds {total} bytes at {t} (capacity {cap}, "
                           f"reserved {reserved.get(g, 0)}): "
                           + ", ".join(f"{what} {b}" for b, what in held))
                break  # one line per GPU
    return bad
