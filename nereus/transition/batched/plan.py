"""The batched path: the DAG of the reference compiler built on GPU arrays.

:func:`batched_units` / :func:`batched_plans` make the same decisions as the reference compiler
(:func:`nereus.transition.reference.compile.compile_transition`) — T_sub and donor choices,
memory checks, resource edges, circular-wait retries, staging — on integer matrices of GPU ids,
one row per unit (:mod:`.local`), and keep the result *batched*: primitives in blocks, edges as
arrays (:class:`.assemble.BatchedDag`). L̂_tran comes from the arrays (:mod:`.cost`); the
per-primitive DAG is built only on demand (:func:`.assemble.expand`). Inputs this path does not
cover (a model-stage whose units differ in layout, per-GPU capacities or reserved bytes, an
invalid collection, a target that cannot be reached, a batch of co-resident primitives that does
not fit) give None: the caller (:mod:`nereus.transition.planned`) then runs the reference
compiler, which gives the same DAG or raises the same error. So do small transitions
(:data:`SMALL_UNITS`), where the reference is the faster of the two.
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from itertools import chain, groupby, starmap
from operator import attrgetter
from struct import Struct
from struct import error as StructError

import numpy as np

from nereus.emu.primitives import StateSizer, shard_bytes
from nereus.emu.unit import Emu, Layout, sub_layout_candidates
from nereus.spec.plan import ExecutionPlan, StagePlan
from nereus.transition.batched.assemble import BatchedDag, assemble
from nereus.transition.batched.blocks import EMPTY, LocalArrays, iota, minus_ones, row_all
from nereus.transition.batched.local import destroy_only, local_arrays
from nereus.transition.batched.memory import excess, fits_beside, peak_top, stage_levels
from nereus.transition.batched.memory_order import order_memory_batches
from nereus.transition.graph import default_stage_rank
from nereus.transition.residency import ConflictSpec, Exclusion, exclusion_for

# Below this many units (source and target together), with no conflict relation given, the
# reference compiler's per-primitive work costs less than the batched path's fixed per-call
# work (about 50 units: 32 GPUs of the benchmark's disjoint plans), so small transitions go
# there; both give the same DAG.
SMALL_UNITS = 48

_STAGE = attrgetter("model_stage")
_STATE = attrgetter("state")
_TP = attrgetter("layout.tp")
_PP = attrgetter("layout.pp")
_GPUS = attrgetter("gpus")


def _units(given: tuple[Emu, ...] | None, sides: dict[str, _Side]
           ) -> tuple[Emu, ...] | tuple[tuple[str, str, Layout, np.ndarray], ...]:
    """The units as given, or (model-stage, state, layout, rows) per model-stage to build them
    from when expanding."""
    if given is not None:
        return given
    return tuple((m, sd.state, sd.lay, sd.rows) for m, sd in sides.items())


@dataclass
class _Side:
    """One model-stage's units on one side as rows of GPU ids (one layout)."""

    lay: Layout
    rows: np.ndarray
    state: str


def _sides(units: Sequence[Emu]) -> dict[str, _Side] | None:
    """Units per model-stage in input order; None when a model-stage mixes layouts or states."""
    runs: dict[str, list[Emu]] = {}
    for m, grp in groupby(units, key=_STAGE):
        got = runs.get(m)
        if got is None:
            runs[m] = list(grp)
        else:
            got.extend(grp)
    out: dict[str, _Side] = {}
    for m, lst in runs.items():
        tps, pps, states = set(map(_TP, lst)), set(map(_PP, lst)), set(map(_STATE, lst))
        if len(tps) != 1 or len(pps) != 1 or len(states) != 1:
            return None
        lay = Layout(tps.pop(), pps.pop())
        rows = np.fromiter(chain.from_iterable(map(_GPUS, lst)), dtype=np.int64,
                           count=len(lst) * lay.size).reshape(len(lst), lay.size)
        out[m] = _Side(lay, rows, states.pop())
    return out


_layout = lru_cache(maxsize=256)(Layout)  # one frozen record per (tp, pp)


@lru_cache(maxsize=64)
def _packer(size: int) -> Struct:
    """Packs ``size`` GPU ids as native int64s (``struct.error`` for any other count, or for
    ids that are not integers of 64 bits)."""
    return Struct(f"={size}q")


def _rows(reps: Sequence[Sequence[int]], size: int) -> np.ndarray | None:
    """The replicas as a (replicas × ``size``) int64 matrix; None when one has another length
    or holds something other than a 64-bit integer. (C-level passes: ``np.fromiter`` over the
    chained tuples and a per-replica length check cost about twice as much.)"""
    try:
        if size == 1:  # unpacking checks each length
            flat = [g for (g,) in reps]
            buf = bytearray(8 * len(flat))
            _packer(len(flat)).pack_into(buf, 0, *flat)
        else:
            buf = bytearray().join(starmap(_packer(size).pack, reps))
    except (StructError, TypeError, ValueError):
        return None
    return np.frombuffer(buf, np.int64).reshape(len(reps), size)


# Replica matrices of the stage plans read so far, by identity: the controller plans every
# transition out of its current plan, which was the target of the last one, so its matrices are
# read once. An entry leaves with its plan (weak reference); the matrices are read-only.
ROW_CACHE: dict[int, tuple[weakref.ref[StagePlan], np.ndarray | None]] = {}


def _forget(key: int, _: object) -> None:
    ROW_CACHE.pop(key, None)


def stage_rows(sp: StagePlan) -> np.ndarray | None:
    """:func:`_rows` of ``sp``'s replicas, kept while ``sp`` lives."""
    key = id(sp)
    got = ROW_CACHE.get(key)
    if got is not None and got[0]() is sp:
        return got[1]
    rows = _rows(sp.replicas, sp.tp * sp.pp)
    if rows is not None:
        rows.flags.writeable = False
    ROW_CACHE[key] = (weakref.ref(sp, partial(_forget, key)), rows)
    return rows


def _plan_sides(plan: ExecutionPlan, states: Mapping[str, str],
                alive: np.ndarray | None) -> dict[str, _Side] | None:
    """:func:`_sides` of ``emus_of_plan(plan, states)`` (units on GPUs outside ``alive`` left
    out); None when a replica is malformed (the reference reports it)."""
    out: dict[str, _Side] = {}
    for sp in plan.stages:
        if sp.name in out or sp.name not in states:
            return None
        if not sp.replicas:
            continue
        rows = stage_rows(sp)
        if rows is None:
            return None
        if alive is not None:
            if rows.min() < 0:
                return None
            inside = rows < alive.size
            inside[inside] = alive[rows[inside]]
            rows = rows[row_all(inside)]
            if not rows.shape[0]:
                continue
        out[sp.name] = _Side(_layout(sp.tp, sp.pp), rows, states[sp.name])
    return out


def _flat(sides: dict[str, _Side], bit: Mapping[str, int] | None
          ) -> tuple[np.ndarray, np.ndarray]:
    """Every GPU the units hold (unit after unit) and its model-stage's number (``bit`` None:
    not wanted, :data:`EMPTY`)."""
    if not sides:
        return EMPTY, EMPTY
    gpus = np.concatenate([sd.rows.reshape(-1) for sd in sides.values()])
    if bit is None:
        return gpus, EMPTY
    stage = np.array([bit[m] for m in sides], dtype=np.int64).repeat(
        [sd.rows.size for sd in sides.values()])
    return gpus, stage


def _owners(gpus: np.ndarray, stage: np.ndarray, size: int, every: bool) -> np.ndarray | None:
    """Per GPU the bitset of model-stages holding it (``every``: its count of holders, all
    model-stages exclusive); None when one model-stage holds a GPU twice."""
    if every:
        return np.bincount(gpus, minlength=size)  # more than 1: the caller rejects it
    if np.bincount(stage * size + gpus).max() > 1:
        return None
    own = np.zeros(size, dtype=np.int64)
    np.bitwise_or.at(own, gpus, np.left_shift(1, stage))
    return own


def _independent(excl: Exclusion, masks: np.ndarray) -> bool:
    """Every bitset in ``masks`` is a set of pairwise non-exclusive model-stages (``masks``
    from :func:`_owners`: with ``excl.pairs`` None, holder counts)."""
    if excl.pairs is None:
        return int(np.maximum.reduce(masks, initial=0)) <= 1
    for a, b in excl.pairs:
        both = (1 << excl.index[a]) | (1 << excl.index[b])
        if np.count_nonzero((masks & both) == both):
            return False
    return True


def batched_units(
    source: Sequence[Emu],
    target: Sequence[Emu],
    sizer: StateSizer,
    *,
    capacity_bytes: int | Mapping[int, int] | None = None,
    reserved_bytes: Mapping[int, int] | None = None,
    stage_rank: Mapping[str, int] | None = None,
    spare_gpus: Sequence[int] = (),
    conflicts: ConflictSpec = None,
    replicated: StateSizer | None = None,
) -> BatchedDag | None:
    """The reference compiler's DAG from ``source`` to ``target`` (same arguments), batched;
    None where this path does not apply (see the module docstring)."""
    small = conflicts is None and len(source) + len(target) < SMALL_UNITS
    if small or reserved_bytes or not (capacity_bytes is None or isinstance(capacity_bytes, int)):
        return None
    src, tgt = _sides(source), _sides(target)
    if src is None or tgt is None:
        return None
    return _plan(src, tgt, tuple(source), tuple(target), sizer, capacity_bytes, stage_rank,
                 spare_gpus, conflicts, replicated)


def batched_plans(
    current: ExecutionPlan,
    target: ExecutionPlan,
    states: Mapping[str, str],
    sizer: StateSizer,
    *,
    capacity_bytes: int | Mapping[int, int] | None = None,
    reserved_bytes: Mapping[int, int] | None = None,
    stage_rank: Mapping[str, int] | None = None,
    spare_gpus: Sequence[int] = (),
    conflicts: ConflictSpec = None,
    replicated: StateSizer | None = None,
    alive: Collection[int] | None = None,
) -> BatchedDag | None:
    """:func:`batched_units` from the units of ``current`` (those whose GPUs are all in
    ``alive``, when given) to the units of ``target``, read straight from the plans' replica
    tuples; None where this path does not apply."""
    small = conflicts is None and sum(len(sp.replicas) for sp in current.stages) \
        + sum(len(sp.replicas) for sp in target.stages) < SMALL_UNITS
    if small or reserved_bytes or not (capacity_bytes is None or isinstance(capacity_bytes, int)):
        return None
    mask = None
    if alive is not None:
        ids = np.fromiter(alive, dtype=np.int64)
        if ids.size and int(ids.min()) < 0:
            return None
        mask = np.zeros(int(ids.max()) + 1 if ids.size else 0, dtype=bool)
        mask[ids] = True
    src = _plan_sides(current, states, mask)
    tgt = _plan_sides(target, states, None)
    if src is None or tgt is None:
        return None
    return _plan(src, tgt, None, None, sizer, capacity_bytes, stage_rank, spare_gpus,
                 conflicts, replicated)


def _plan(
    src: dict[str, _Side],
    tgt: dict[str, _Side],
    source: tuple[Emu, ...] | None,
    target: tuple[Emu, ...] | None,
    sizer: StateSizer,
    capacity: int | None,
    stage_rank: Mapping[str, int] | None,
    spare_gpus: Sequence[int],
    conflicts: ConflictSpec,
    replicated: StateSizer | None,
) -> BatchedDag | None:
    excl = exclusion_for(set(src) | set(tgt), conflicts)
    if any(m not in src or src[m].state != t.state for m, t in tgt.items()):
        return None  # the reference reports it
    bit = excl.index
    every = excl.pairs is None
    sg, ss = _flat(src, None if every else bit)  # all exclusive: holder counts, no numbers
    tg, ts = _flat(tgt, None if every else bit)
    both = np.concatenate([sg, tg, np.array(spare_gpus, dtype=np.int64)])
    if not both.size or int(np.minimum.reduce(both)) < 0:
        return None  # GPU ids index arrays here (the reference takes negative ones)
    size = int(np.maximum.reduce(both)) + 1
    src_own, tgt_own = _owners(sg, ss, size, every), _owners(tg, ts, size, every)
    if src_own is None or tgt_own is None or not _independent(excl, src_own) \
            or not _independent(excl, tgt_own):
        return None  # an invalid collection: the reference raises
    rank = dict(stage_rank or {})
    names = sorted(src, key=lambda m: (rank.get(m, default_stage_rank(m)), m))
    if excl.pairs is None:  # every model-stage holds a GPU against every other
        held_all, target_all = src_own != 0, tgt_own != 0
        held_for = dict.fromkeys(names, held_all)
        target_for = dict.fromkeys(names, target_all)
    else:
        excl_bits = {m: sum(1 << bit[c] for c in excl.names if excl.exclusive(m, c))
                     for m in names}
        held_for = {m: (src_own & excl_bits[m]) != 0 for m in names}
        target_for = {m: (tgt_own & excl_bits[m]) != 0 for m in names}
    by_src: dict[str, np.ndarray] = {}
    in_place: dict[str, np.ndarray] = {}
    by_tgt: dict[str, np.ndarray] = {}
    for m in names:
        s, t = src[m], tgt.get(m)
        if t is None or t.lay != s.lay or not t.rows.size:
            by_src[m], in_place[m] = s.rows, s.rows[:0]
            by_tgt[m] = t.rows if t is not None else np.zeros((0, 1), dtype=np.int64)
            continue
        tab = minus_ones(size)
        tab[t.rows[:, 0]] = iota(0, t.rows.shape[0])
        hit = tab[s.rows[:, 0]]
        same = row_all(t.rows.take(hit, axis=0) == s.rows)
        same &= hit >= 0
        if not same.any():
            by_src[m], in_place[m], by_tgt[m] = s.rows, s.rows[:0], t.rows
            continue
        by_src[m], in_place[m] = s.rows.compress(~same, axis=0), s.rows.compress(same, axis=0)
        matched = np.zeros(t.rows.shape[0], dtype=bool)
        matched[hit[same]] = True
        by_tgt[m] = t.rows.compress(~matched, axis=0)
    state_of = {m: sizer(m) for m in names}
    rep_of = {m: replicated(m) if replicated is not None else 0 for m in names}
    co_res = capacity is not None and excl.pairs is not None
    floors: dict[str, np.ndarray] = {}
    load_for: dict[str, np.ndarray | None] = {}
    if co_res:
        for m in names:
            before = np.zeros(size, dtype=np.int64)
            before[src[m].rows] = shard_bytes(state_of[m], src[m].lay, rep_of[m])
            after = np.zeros(size, dtype=np.int64)
            if m in tgt:
                after[tgt[m].rows] = shard_bytes(state_of[m], tgt[m].lay, rep_of[m])
            floors[m] = np.where((before > 0) & (after > 0), np.minimum(before, after), 0)
        for m in names:
            load = sum((floors[c] for c in names if not excl.exclusive(m, c)),
                       np.zeros(size, dtype=np.int64))
            load_for[m] = load if load.any() else None
    cands = {}
    for m in names:
        lays = {src[m].lay} if by_src[m].size or in_place[m].size else set()
        if by_tgt[m].size:
            lays.add(tgt[m].lay)
        cands[m] = sub_layout_candidates(frozenset((lay.tp, lay.pp) for lay in lays))
    choice = {m: [0, 0] for m in names}
    spare: list[int] = []
    released: list[int] = []
    staging: dict[str, tuple[int, ...]] = {}

    def fits(m: str, loc: LocalArrays) -> bool:
        if capacity is None:
            return True
        lt = tgt[m].lay if m in tgt else src[m].lay
        if excl.pairs is None:
            top = peak_top(loc, state_of[m], rep_of[m])
            if in_place[m].size:
                top = max(top, shard_bytes(state_of[m], lt, rep_of[m]))
            return top <= capacity
        lv = stage_levels(loc, state_of[m], rep_of[m], in_place[m], lt, size)
        loc.levels = lv
        return fits_beside(m, lv, floors, excl, capacity)

    def local_for(m: str) -> LocalArrays | None:
        s = src[m]
        if not by_tgt[m].size:
            loc = destroy_only(m, s.state, by_src[m], s.lay, size)
            fits(m, loc)
            return loc
        t = tgt[m]
        while choice[m][0] < len(cands[m]):
            got = local_arrays(m, s.state, by_src[m], s.lay, by_tgt[m], t.lay,
                               cands[m][choice[m][0]], held_for[m], target_for[m],
                               in_place[m], choice[m][1], staging.get(m, ()), load_for.get(m))
            if got is not None:
                if fits(m, got):
                    return got
                if got.donor:
                    choice[m][1] += 1
                    continue
            choice[m] = [choice[m][0] + 1, 0]
        return None

    locs: dict[str, LocalArrays] = {}
    for m in names:
        got = local_for(m)
        if got is None:
            return None  # the reference raises
        locs[m] = got
    exhausted: set[str] = set()
    while True:
        dag, cycle = assemble(_units(source, src), _units(target, tgt), names, locs, rank,
                              excl, state_of, rep_of, replicated is not None)
        if not cycle:
            break
        for m in dict.fromkeys(cycle):
            if not locs[m].donor or m in exhausted:
                continue
            saved = list(choice[m])
            choice[m][1] += 1
            got = local_for(m)
            if got is not None:
                locs[m] = got
                break
            choice[m] = saved
            exhausted.add(m)
        else:
            if not staging:  # staging GPUs: free ones first, then ones no target needs
                all_held, all_target = src_own != 0, tgt_own != 0
                spare = [g for g in sorted(set(spare_gpus)) if not all_held[g]
                         and not all_target[g]]
                released = (all_held & ~all_target).nonzero()[0].tolist()
            stage_m, lay = None, None
            for pool_name in ("spare", "released"):
                avail = spare if pool_name == "spare" else released
                for m in dict.fromkeys(cycle):
                    lay = locs[m].t_sub
                    if locs[m].donor and not locs[m].staged and lay is not None \
                            and len(avail) >= lay.size:
                        stage_m = m
                        break
                if stage_m is not None:
                    break
            if stage_m is None or lay is None:
                return None  # the reference raises
            if len(spare) >= lay.size:
                staging[stage_m], spare = tuple(spare[: lay.size]), spare[lay.size:]
            else:
                staging[stage_m], released = tuple(released[: lay.size]), released[lay.size:]
            got = local_for(stage_m)
            if got is None:
                return None
            locs[stage_m] = got
            exhausted.clear()
    if co_res:
        assert capacity is not None
        lvs = {m: locs[m].levels for m in names}
        bad = excess({m: lv for m, lv in lvs.items() if lv is not None}, excl, capacity)
        if bad.size:
            held = [(k, src[m].rows, shard_bytes(state_of[m], src[m].lay, rep_of[m]))
                    for k, m in enumerate(names)]
            got_dag = order_memory_batches(dag, bad.tolist(), capacity, held)
            if got_dag is None:
                return None  # a batch that does not fit: the reference orders phases
            dag = got_dag
    return dag
