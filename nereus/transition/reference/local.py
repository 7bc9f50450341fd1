"""One model-stage's local transition DAG (DESIGN.md §2.3 item 1): Split → Destroy → Extend → Merge.

Units are keyed by their GPU tuple: every unit of the model-stage that the local DAG reads,
produces or destroys at T_sub has its own GPU tuple. :mod:`compile` joins the local DAGs.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from nereus.emu.primitives import Destroy, Extend, Merge, Primitive, Split, record
from nereus.emu.regions import (
    GROUPINGS,
    groupings_differ,
    new_emu,
    sub_unit_gpus,
    sub_units,
)
from nereus.emu.unit import Emu, Layout


@dataclass
class LocalDag:
    """One model-stage's primitives and edges (local indices) and what the compiler needs of it."""

    prims: list[Primitive] = field(default_factory=list)
    edges: list[tuple[int, int, str]] = field(default_factory=list)
    release: dict[int, int] = field(default_factory=dict)  # GPU → local Destroy index
    levels: dict[int, int] = field(default_factory=dict)  # GPU → most bytes held (residency)
    donor: bool = False
    staged: bool = False
    t_sub: Layout | None = None

    def add(self, p: Primitive) -> int:
        self.prims.append(p)
        return len(self.prims) - 1


def _best_grouping(options: Mapping[str, tuple[tuple[int, ...], ...]],
                   others: AbstractSet[tuple[int, ...]]) -> str:
    """The grouping whose sub-units (``options``: grouping → GPU tuples) hit ``others`` most
    often (interleaved on ties)."""
    if len(options) == 1:
        return GROUPINGS[0]
    best, hits = GROUPINGS[0], -1
    for grp, tuples in options.items():
        n = sum(t in others for t in tuples)
        if n > hits:
            best, hits = grp, n
    return best


def _sub_options(unit: Emu, t_sub: Layout) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Sub-unit GPU tuples of ``unit`` per grouping that differs (interleaved first)."""
    if groupings_differ(unit.layout, t_sub):
        return {grp: sub_unit_gpus(unit, t_sub, grp) for grp in GROUPINGS}
    return {GROUPINGS[0]: sub_unit_gpus(unit, t_sub, GROUPINGS[0])}


@dataclass
class _Source:
    """A unit an Extend may copy from, and the round (in Extend steps) it is next free."""

    unit: Emu
    free_at: int


def local_dag(
    srcs: list[Emu],
    tgts: list[Emu],
    t_sub: Layout,
    state_bytes: int,
    held: AbstractSet[int],
    target_gpus: frozenset[int],
    replicas: Sequence[Emu] = (),
    donor_rank: int = 0,
    staging: tuple[int, ...] = (),
    load: Mapping[int, int] | None = None,
    replicated_bytes: int = 0,
) -> LocalDag | None:
    """One model-stage's local DAG through ``t_sub``; None when no copy can reach the target.

    ``load`` (bytes co-resident model-stages hold per GPU) makes Extends read first from sources
    on the least loaded GPUs (a sender holds a send buffer beside its shard).
    """
    loc = LocalDag()
    if not tgts:
        for u in srcs:
            d = loc.add(Destroy(u, state_bytes, replicated_bytes))
            loc.release.update(dict.fromkeys(u.gpus, d))
        return loc
    loc.t_sub = t_sub
    # Per unit the sub-unit grouping that lands most sub-units exactly on a target slot.
    # Units below are keyed by their GPU tuple: every unit of this model-stage the local DAG
    # reads, produces or destroys at t_sub has its own GPU tuple.
    sub_tp, sub_pp = t_sub.tp, t_sub.pp
    at_sub = [u.layout.tp == sub_tp and u.layout.pp == sub_pp for u in srcs]
    src_opts = [{} if a else _sub_options(u, t_sub) for u, a in zip(srcs, at_sub, strict=True)]
    src_tuples: set[tuple[int, ...]] = {u.gpus for u, a in zip(srcs, at_sub, strict=True) if a}
    for opts in src_opts:
        for tuples in opts.values():
            src_tuples.update(tuples)
    tgt_parts: list[tuple[str, tuple[tuple[int, ...], ...]]] = []
    slot_gpus: set[tuple[int, ...]] = set()
    for v in tgts:
        opts = _sub_options(v, t_sub)
        grp = _best_grouping(opts, src_tuples)
        tgt_parts.append((grp, opts[grp]))
        slot_gpus.update(opts[grp])
    producer: dict[tuple[int, ...], int] = {}
    made: dict[tuple[int, ...], Emu] = {}  # units at t_sub already built, by GPU tuple
    kept: list[Emu] = []
    surplus: list[Emu] = []  # at t_sub
    whole: list[Emu] = []  # surplus units left unsplit
    for u, opts, a in zip(srcs, src_opts, at_sub, strict=True):
        if a:
            (kept if u.gpus in slot_gpus else surplus).append(u)
            continue
        grp = _best_grouping(opts, slot_gpus)
        if not slot_gpus.isdisjoint(opts[grp]):
            subs = tuple([new_emu(u.model_stage, u.state, t_sub, t) for t in opts[grp]])
            i = loc.add(record(Split, u, subs, state_bytes, grp, replicated_bytes))
            for sub in subs:
                producer[sub.gpus] = i
                made[sub.gpus] = sub
                (kept if sub.gpus in slot_gpus else surplus).append(sub)
        else:
            whole.append(u)
    kept_gpus = {k.gpus for k in kept}
    unfilled = [
        new_emu(v.model_stage, v.state, t_sub, g)
        for v, (_, parts) in zip(tgts, tgt_parts, strict=True)
        for g in parts
        if g not in kept_gpus
    ]
    unfilled.sort(key=lambda s: not held.isdisjoint(s.gpus))  # free GPUs first (stable)
    reads: dict[tuple[int, ...], list[int]] = {}
    donor: Emu | None = None
    # Sources: kept sub-units and surplus ones on GPUs no target needs (nobody waits for them).
    pool = [_Source(s, 1 if s.gpus in producer else 0) for s in kept]
    pool += [_Source(s, 0) for s in surplus if target_gpus.isdisjoint(s.gpus)]
    pool += [_Source(r, 0) for r in replicas
             if r.layout.tp == sub_tp and r.layout.pp == sub_pp]  # units already in place
    if unfilled and not pool:
        own = frozenset(g for v in tgts for g in v.gpus)
        donor = _pick_donor(loc, surplus, whole, unfilled, t_sub, state_bytes, producer, held,
                            target_gpus - own, donor_rank, replicated_bytes)
        if donor is None:
            return None
        loc.donor = True
        surplus = [s for s in surplus if s != donor] + [donor]
        if len(staging) == t_sub.size:
            # Copy the donor onto spare GPUs first: the donor then waits for nobody.
            stage = Emu(donor.model_stage, donor.state, t_sub, staging)
            e0 = loc.add(Extend(donor, stage, state_bytes, replicated_bytes))
            if donor.gpus in producer:
                loc.edges.append((producer[donor.gpus], e0, "data"))
            reads[donor.gpus] = [e0]
            producer[stage.gpus] = e0
            surplus.append(stage)
            pool.append(_Source(stage, 1))
            loc.staged = True
        else:
            pool.append(_Source(donor, 1 if donor.gpus in producer else 0))
    if load:
        pool.sort(key=lambda src: (src.free_at, max(load.get(g, 0) for g in src.unit.gpus)))
    heap = [(src.free_at, k, src.unit) for k, src in enumerate(pool)]
    heapq.heapify(heap)
    tie = len(heap)
    for slot in unfilled:
        blocked = 0 if held.isdisjoint(slot.gpus) else 1
        slot_set = set(slot.gpus)
        skipped = []
        while heap and not slot_set.isdisjoint(heap[0][2].gpus):
            skipped.append(heapq.heappop(heap))
        if not heap:
            return None
        free_at, _, src = heapq.heappop(heap)
        for item in skipped:
            heapq.heappush(heap, item)
        start = max(free_at, blocked)
        e = loc.add(record(Extend, src, slot, state_bytes, replicated_bytes))
        if src.gpus in producer:
            loc.edges.append((producer[src.gpus], e, "data"))
        prev = reads.setdefault(src.gpus, [])
        if prev:
            loc.edges.append((prev[-1], e, "order"))
        prev.append(e)
        if donor is None or src.gpus != donor.gpus:  # the donor is read once: it may be waited for
            heapq.heappush(heap, (start + 1, tie, src))
        heapq.heappush(heap, (start + 1, tie + 1, slot))
        tie += 2
        producer[slot.gpus] = e
        made[slot.gpus] = slot
    for s in surplus:
        d = loc.add(record(Destroy, s, state_bytes, replicated_bytes))
        if s.gpus in producer:
            loc.edges.append((producer[s.gpus], d, "data"))
        if s.gpus in reads:
            loc.edges.extend([(e, d, "data") for e in reads[s.gpus]])
        loc.release.update(dict.fromkeys(s.gpus, d))
    for w in whole:
        d = loc.add(record(Destroy, w, state_bytes, replicated_bytes))
        loc.release.update(dict.fromkeys(w.gpus, d))
    for v, (grp, part_gpus) in zip(tgts, tgt_parts, strict=True):
        if v.layout.tp == sub_tp and v.layout.pp == sub_pp:
            continue
        parts = tuple([made.get(g) or new_emu(v.model_stage, v.state, t_sub, g)
                       for g in part_gpus])
        mg = loc.add(record(Merge, parts, v, state_bytes, grp, replicated_bytes))
        for g in part_gpus:
            if g in producer:
                loc.edges.append((producer[g], mg, "data"))
            if g in reads:
                loc.edges.extend([(e, mg, "data") for e in reads[g]])
    prims = loc.prims
    for i, p in enumerate(prims):
        if isinstance(p, Extend):
            new = p.new.gpus
            for gpu in new:
                rel = loc.release.get(gpu)
                if rel is not None:
                    gone = prims[rel]
                    if not isinstance(gone, Destroy) or gone.unit.gpus != new:  # not its copy
                        loc.edges.append((rel, i, "local"))
    return loc


def _pick_donor(
    loc: LocalDag,
    surplus: list[Emu],
    whole: list[Emu],
    unfilled: list[Emu],
    t_sub: Layout,
    state_bytes: int,
    producer: dict[tuple[int, ...], int],
    held: AbstractSet[int],
    others_need: frozenset[int],
    rank: int,
    replicated_bytes: int = 0,
) -> Emu | None:
    """The ``rank``-th best copy to keep until an Extend has copied it (None: no more).

    It must be disjoint from some unfilled slot; better when that slot's GPUs are free now, when
    no other model-stage's target needs the donor's GPUs, and when it needs no Split.
    """
    free_slots = [frozenset(x.gpus) for x in unfilled if not any(g in held for g in x.gpus)]
    held_slots = [frozenset(x.gpus) for x in unfilled if any(g in held for g in x.gpus)]

    def score(s: Emu) -> tuple[int, int]:
        fit = -1
        if any(f.isdisjoint(s.gpus) for f in free_slots):
            fit = 1
        elif any(f.isdisjoint(s.gpus) for f in held_slots):
            fit = 0
        return fit, 0 if others_need.intersection(s.gpus) else 1

    cands: list[tuple[tuple[int, int, int], Emu, Emu | None]] = []
    for s in surplus:
        sc = score(s)
        if sc[0] >= 0:
            cands.append(((1, *sc), s, None))
    for w in whole:
        for s in sub_units(w, t_sub):
            sc = score(s)
            if sc[0] >= 0:
                cands.append(((0, *sc), s, w))
    cands.sort(key=lambda c: c[0], reverse=True)  # stable: earlier units first on ties
    if rank >= len(cands):
        return None
    _, donor, parent = cands[rank]
    if parent is not None:
        whole.remove(parent)
        subs = sub_units(parent, t_sub)
        i = loc.add(Split(parent, subs, state_bytes, GROUPINGS[0], replicated_bytes))
        for s in subs:
            producer[s.gpus] = i
        surplus.extend(s for s in subs if s != donor)
    return donor
