"""One model-stage's local DAG over GPU arrays: :func:`local.local_dag` without per-record work.

The same decisions in the same order — sub-unit grouping per unit, kept / surplus / whole units,
unfilled slots (free GPUs first), the donor, the Extends' sources from the broadcast heap, the
Destroys, the Merges and every edge — computed on integer matrices of GPU ids (one row per unit)
for a model-stage whose source units share one layout and whose target units share one layout
(what placed plans give). Primitives come in *blocks*: consecutive local indices of one kind and
layout pair, a row per primitive; :mod:`expand` turns them into the records of
:mod:`primitives`. Edges carry a sort key that reproduces the reference's edge order.

The heap of :func:`local.local_dag` is replayed bucket by bucket: every item pushed while the
items of round F are popped has a round above F, so the items of one round leave in tie order
(pool items first, in pool order, then pushes in push order) and a round is one slice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from nereus.emu.unit import Layout
from nereus.transition.regions import _sub_index_n, groupings_differ

DESTROY, SPLIT, EXTEND, MERGE = 0, 1, 2, 3  # KIND_ORDER codes: release first
EDGE_CODES = ("data", "local", "resource", "order", "memory")
DATA, LOCAL, RESOURCE, ORDER, MEMORY = range(5)
INTERLEAVED, CONTIGUOUS = 0, 1
NONE = -(1 << 40)  # "no such primitive": stays negative after adding any offset
_EMPTY = np.zeros(0, dtype=np.int64)


def none_array(n: int) -> np.ndarray:
    """``n`` entries of :data:`NONE`."""
    out = np.empty(n, dtype=np.int64)
    out.fill(NONE)
    return out


@dataclass
class Block:
    """``len(rows)`` primitives of one kind at local indices ``start …``.

    ``rows``: Split — source units (layout ``lay``, split into ``sub``); Merge — merged units
    (layout ``lay``, from parts of layout ``sub``); Extend — source units (``lay``), with the new
    units in ``new``; Destroy — the destroyed units (``lay``). ``grouping`` per Split / Merge.
    """

    kind: int
    start: int
    rows: np.ndarray
    lay: Layout
    sub: Layout | None = None
    new: np.ndarray | None = None
    grouping: np.ndarray | None = None
    contiguous: bool = False  # some member uses the contiguous grouping

    @property
    def count(self) -> int:
        return int(self.rows.shape[0])


@dataclass
class Edges:
    """Edge chunks ``(before, after, kind, section, owner, part, sub)``: the arrays of one kind
    and what orders them as the reference appends them, the key ``(section, owner, part,
    sub)`` (computed only when expanding). An entry whose ``before`` or ``after`` is negative
    (:data:`NONE`) is no edge; they are dropped once, over all chunks."""

    chunks: list[tuple[np.ndarray, np.ndarray, int, int, np.ndarray,
                       np.ndarray | int, np.ndarray | int]] = field(default_factory=list)

    def add(self, a: np.ndarray, b: np.ndarray, kind: int, sec: int, owner: np.ndarray,
            part: np.ndarray | int, sub: np.ndarray | int) -> None:
        if a.size:
            self.chunks.append((a, b, kind, sec, owner, part, sub))


@dataclass
class LocalArrays:
    """One model-stage's local DAG (local indices), as :class:`local.LocalDag` holds it."""

    stage: str
    state: str
    blocks: list[Block]
    n: int
    edges: Edges
    release: np.ndarray  # GPU → local index of the Destroy that frees it (negative: none)
    donor: bool = False
    staged: bool = False
    t_sub: Layout | None = None
    staging: tuple[int, ...] = ()
    levels: np.ndarray | None = None  # GPU → most bytes held (co-resident memory check)


@lru_cache(maxsize=4096)
def sub_index(tp: int, pp: int, sub_tp: int, sub_pp: int, grouping: int) -> np.ndarray:
    """Positions (k × |sub|) of the sub-units of a (tp, pp) unit split into (sub_tp, sub_pp)."""
    grp = "interleaved" if grouping == INTERLEAVED else "contiguous"
    out = np.array(_sub_index_n(tp, pp, sub_tp, sub_pp, grp), dtype=np.int64)
    out.flags.writeable = False
    return out


def _first_table(rows: np.ndarray, size: int) -> np.ndarray:
    """GPU → index of the row starting at it (rows pairwise disjoint), -1 elsewhere."""
    tab = np.empty(size, dtype=np.int64)
    tab.fill(-1)
    tab[rows[:, 0]] = np.arange(rows.shape[0])
    return tab


def _member(q: np.ndarray, tab: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For each row of ``q`` (…, s): whether it equals a row of ``rows`` (by ``tab``)."""
    if not rows.shape[0]:
        return np.zeros(q.shape[:-1], dtype=bool)
    ids = tab[q[..., 0]]
    hit: np.ndarray = np.logical_and.reduce(rows[ids] == q, axis=-1)
    hit &= ids >= 0
    return hit


def destroy_only(stage: str, state: str, srcs: np.ndarray, lay: Layout, size: int) -> LocalArrays:
    """A model-stage with nothing to build: every unit is destroyed."""
    n = srcs.shape[0]
    release = none_array(size)
    release[srcs] = np.arange(n)[:, None]
    return LocalArrays(stage, state, [Block(DESTROY, 0, srcs, lay)] if n else [], n, Edges(),
                       release)


def local_arrays(
    stage: str,
    state: str,
    srcs: np.ndarray,
    ls: Layout,
    tgts: np.ndarray,
    lt: Layout,
    t_sub: Layout,
    held: np.ndarray,
    target_gpus: np.ndarray,
    replicas: np.ndarray,
    donor_rank: int = 0,
    staging: tuple[int, ...] = (),
    load: np.ndarray | None = None,
) -> LocalArrays | None:
    """:func:`local.local_dag` for ``srcs`` (rows of layout ``ls``), ``tgts`` (rows of layout
    ``lt``, at least one) and the in-place ``replicas`` (rows of layout ``lt``); ``held``,
    ``target_gpus`` and ``load`` are per-GPU arrays. None when no copy can reach the target."""
    size = held.shape[0]
    st, sp = t_sub.tp, t_sub.pp
    s = st * sp
    nsrc = srcs.shape[0]
    at_sub = ls.tp == st and ls.pp == sp
    lt_sub = lt.tp == st and lt.pp == sp
    s_differ = not at_sub and groupings_differ(ls, t_sub)
    # target slots: per target unit the grouping that lands most parts on source tuples
    if lt_sub:
        slot_rows = tgts
        kt = 1
        tgt_grp = None
        tgt_contig = False
    else:
        slots_i = tgts[:, sub_index(lt.tp, lt.pp, st, sp, INTERLEAVED)]
        kt = slots_i.shape[1]
        if groupings_differ(lt, t_sub):
            slots_c = tgts[:, sub_index(lt.tp, lt.pp, st, sp, CONTIGUOUS)]
            tables = []
            if at_sub:
                tables.append((_first_table(srcs, size), srcs))
            else:
                for g in (INTERLEAVED, CONTIGUOUS) if s_differ else (INTERLEAVED,):
                    rows = srcs[:, sub_index(ls.tp, ls.pp, st, sp, g)].reshape(-1, s)
                    tables.append((_first_table(rows, size), rows))

            def in_src(q: np.ndarray) -> np.ndarray:
                hit = _member(q, *tables[0])
                for tab, rows in tables[1:]:
                    hit |= _member(q, tab, rows)
                return hit

            hits_ti = np.add.reduce(in_src(slots_i), axis=1)
            if int(hits_ti.min()) == kt:  # every interleaved part lands: nothing can beat it
                tgt_grp = np.zeros(tgts.shape[0], dtype=np.int8)
            else:
                tgt_grp = (np.add.reduce(in_src(slots_c), axis=1) > hits_ti).astype(np.int8)
            tgt_contig = bool(np.count_nonzero(tgt_grp))
            slot_rows = (np.where(tgt_grp[:, None, None] == 1, slots_c, slots_i) if tgt_contig
                         else slots_i).reshape(-1, s)
        else:
            tgt_grp = np.zeros(tgts.shape[0], dtype=np.int8)
            tgt_contig = False
            slot_rows = slots_i.reshape(-1, s)
    nslots = slot_rows.shape[0]
    slot_tab = _first_table(slot_rows, size)

    blocks: list[Block] = []
    n = 0
    # units at t_sub, by id: [sources' parts | slots | replicas | donor's parts | staged copy]
    whole = srcs[:0]
    if at_sub:
        unit_rows = srcs
        kept_hit = _member(srcs, slot_tab, slot_rows)
        producer = none_array(nsrc)
    else:
        si = sub_index(ls.tp, ls.pp, st, sp, INTERLEAVED)
        subs = srcs[:, si]
        hits = _member(subs, slot_tab, slot_rows)
        grp = None
        src_contig = False
        if s_differ:
            subs_c = srcs[:, sub_index(ls.tp, ls.pp, st, sp, CONTIGUOUS)]
            hits_c = _member(subs_c, slot_tab, slot_rows)
            grp = (np.add.reduce(hits_c, axis=1) > np.add.reduce(hits, axis=1)).astype(np.int8)
            pick = grp == 1
            if np.count_nonzero(pick):
                src_contig = True
                subs = np.where(pick[:, None, None], subs_c, subs)
                hits = np.where(pick[:, None], hits_c, hits)
        split = np.logical_or.reduce(hits, axis=1)
        split_n = int(np.count_nonzero(split))
        if split_n == nsrc:
            srows = srcs
        else:
            whole = srcs[~split]
            srows, subs, hits = srcs[split], subs[split], hits[split]
            if grp is not None:
                grp = grp[split]
        unit_rows = subs.reshape(-1, s)
        kept_hit = hits.reshape(-1)
        producer = np.arange(split_n).repeat(subs.shape[1])
        if split_n:
            blocks.append(Block(SPLIT, 0, srows, ls, t_sub, grouping=grp if grp is not None
                                else np.zeros(split_n, dtype=np.int8),
                                contiguous=src_contig and grp is not None
                                and bool(np.count_nonzero(grp))))
            n = split_n
    n_base = unit_rows.shape[0]
    kept = kept_hit.nonzero()[0]
    surplus = (~kept_hit).nonzero()[0]
    # slots: ids n_base + slot index; a kept slot is the unit already there
    slot_unit = np.arange(n_base, n_base + nslots)
    unfilled_mask = np.ones(nslots, dtype=bool)
    if kept.size:
        kept_slot = slot_tab[unit_rows[kept, 0]]
        slot_unit[kept_slot] = kept
        unfilled_mask[kept_slot] = False
    if kept.size == nslots:  # each kept unit is a distinct slot: all slots hold theirs
        unfilled = blocked = _EMPTY
    else:
        unfilled = unfilled_mask.nonzero()[0]
        blocked = held[slot_rows[unfilled]].any(1)
        n_blocked = int(np.count_nonzero(blocked))
        if n_blocked and n_blocked < unfilled.size:  # free GPUs first (stable)
            unfilled = np.concatenate([unfilled[~blocked], unfilled[blocked]])
            blocked = np.concatenate([np.zeros(unfilled.size - n_blocked, dtype=bool),
                                      np.ones(n_blocked, dtype=bool)])
    loc = LocalArrays(stage, state, blocks, n, Edges(), none_array(size), t_sub=t_sub)
    edges = loc.edges
    donor = -1
    staged = -1  # the staged copy's id
    e0 = -1
    if not unfilled.size:  # every slot holds its unit already: no Extends
        all_rows, all_prod, n_units = unit_rows, producer, n_base
        ext_src = ext_prev = slot_ids = _EMPTY
    else:
        has_rep = lt_sub and replicas.shape[0] > 0
        n_units = n_base + nslots + (replicas.shape[0] if has_rep else 0)
        # the pool: kept units, surplus units on GPUs no target needs, units already in place
        pool = kept
        pool_free = producer[kept] >= 0
        if surplus.size:
            free_sur = surplus[~np.logical_or.reduce(target_gpus[unit_rows[surplus]], axis=1)]
            if free_sur.size:
                pool = np.concatenate([pool, free_sur])
                pool_free = np.concatenate([pool_free, np.zeros(free_sur.size, dtype=bool)])
        if has_rep:
            pool = np.concatenate([pool, np.arange(n_base + nslots, n_units)])
            pool_free = np.concatenate([pool_free, np.zeros(replicas.shape[0], dtype=bool)])
        rows_parts = [unit_rows, slot_rows] + ([replicas] if has_rep else [])
        prod_parts = [producer, none_array(n_units - n_base)]
        if not pool.size:
            own = np.zeros(size, dtype=bool)
            own[tgts] = True
            picked = _pick_donor(unit_rows, surplus, whole, slot_rows[unfilled], blocked, held,
                                 target_gpus & ~own, donor_rank, ls, t_sub)
            if picked is None:
                return None
            from_whole, which = picked
            if from_whole >= 0:  # split its parent (interleaved) and keep the other parts surplus
                parent = whole[from_whole]
                whole = np.delete(whole, from_whole, axis=0)
                blocks.append(Block(SPLIT, n, parent[None, :], ls, t_sub,
                                    grouping=np.zeros(1, dtype=np.int8)))
                subs = parent[sub_index(ls.tp, ls.pp, st, sp, INTERLEAVED)]
                ids = np.arange(n_units, n_units + subs.shape[0])
                rows_parts.append(subs)
                prod_parts.append(np.full(subs.shape[0], n, dtype=np.int64))
                n_units += subs.shape[0]
                n += 1
                donor = int(ids[which])
                surplus = np.concatenate([surplus, np.delete(ids, which), [donor]])
            else:
                donor = int(surplus[which])
                surplus = np.concatenate([surplus[surplus != donor], [donor]])
            loc.donor = True
            donor_prod = int(np.concatenate(prod_parts)[donor])
            if len(staging) == s:  # copy the donor onto spare GPUs first
                stage_rows = np.array([staging], dtype=np.int64)
                e0 = n
                donor_row = np.concatenate(rows_parts)[donor]
                blocks.append(Block(EXTEND, n, donor_row[None, :], t_sub, new=stage_rows))
                n += 1
                if donor_prod >= 0:
                    edges.add(np.array([donor_prod]), np.array([e0]), DATA, 0, np.array([e0]), 0,
                              0)
                rows_parts.append(stage_rows)
                prod_parts.append(np.array([e0], dtype=np.int64))
                staged = n_units
                n_units += 1
                surplus = np.concatenate([surplus, [staged]])
                pool = np.array([staged], dtype=np.int64)
                pool_free = np.ones(1, dtype=bool)
                loc.staged = True
                loc.staging = staging
            else:
                pool = np.array([donor], dtype=np.int64)
                pool_free = np.array([donor_prod >= 0])
        all_rows = np.concatenate(rows_parts)
        all_prod = np.concatenate(prod_parts)
        if donor >= 0 and staged < 0 and not \
                set(all_rows[donor].tolist()).isdisjoint(slot_rows[unfilled[0]].tolist()):
            return None  # the donor (the heap's only item) overlaps the first slot
        if load is not None and pool.size > 1:
            perm = np.lexsort((load[all_rows[pool]].max(1), pool_free))
            pool, pool_free = pool[perm], pool_free[perm]
        # the broadcast heap, a round at a time; the j-th Extend fills the j-th unfilled slot
        slot_ids = unfilled + n_base
        ext_src, ext_prev = _heap_rounds(pool, pool_free, slot_ids, blocked,
                                         donor if staged < 0 else -1)
    n_ext = ext_src.size
    readers = n_ext > 0 or e0 >= 0
    if readers:
        owner = none_array(n_units)  # unit → the Destroy or Merge it feeds
        part_of = np.zeros(n_units, dtype=np.int64)
    ext_idx = np.arange(n, n + n_ext)
    if n_ext:
        blocks.append(Block(EXTEND, n, all_rows[ext_src], t_sub, new=slot_rows[unfilled]))
        all_prod[slot_ids] = ext_idx
        edges.add(all_prod[ext_src], ext_idx, DATA, 0, ext_idx, 0, 0)
        # order: the previous Extend reading the same source
        edges.add(ext_prev + n, ext_idx, ORDER, 0, ext_idx, 0, 1)
        n += n_ext
    # Destroys: surplus units (after their producer and readers), then whole units
    if surplus.size:
        d_idx = np.arange(n, n + surplus.size)
        rows = all_rows[surplus]
        blocks.append(Block(DESTROY, n, rows, t_sub))
        edges.add(all_prod[surplus], d_idx, DATA, 0, d_idx, 0, 0)
        if readers:
            owner[surplus] = d_idx
        loc.release[rows] = d_idx[:, None]
        n += surplus.size
    if whole.shape[0]:
        d_idx = np.arange(n, n + whole.shape[0])
        blocks.append(Block(DESTROY, n, whole, ls))
        loc.release[whole] = d_idx[:, None]
        n += whole.shape[0]
    # Merges: every target unit not at t_sub, from its parts
    if not lt_sub:
        nt = tgts.shape[0]
        assert tgt_grp is not None
        blocks.append(Block(MERGE, n, tgts, lt, t_sub, grouping=tgt_grp, contiguous=tgt_contig))
        parts = slot_unit  # (targets × parts) unit ids, flat
        flat = np.arange(nt * kt)
        own_m = flat // kt + n
        part_no = flat % kt
        edges.add(all_prod[parts], own_m, DATA, 0, own_m, part_no, 0)
        if readers:
            owner[parts] = own_m
            part_of[parts] = part_no
        n += nt
    # readers: every Extend reading a unit precedes the Destroy or Merge of that unit
    if readers:
        reads_src, reads_ext = ext_src, ext_idx
        if e0 >= 0:
            reads_src = np.concatenate([[donor], ext_src])
            reads_ext = np.concatenate([[e0], ext_idx])
        o = owner[reads_src]
        edges.add(reads_ext, o, DATA, 0, o, part_of[reads_src], 1 + reads_ext)
    # local: a GPU an Extend acquires waits for the Destroy of this model-stage that frees it
    # (the staged copy's own Destroy excepted; no other destroyed unit equals a slot)
    if n_ext:
        rel = loc.release[slot_rows[unfilled]].reshape(-1)  # (Extends × GPUs), flat
        flat = np.arange(n_ext * s)
        own_e = flat // s + ext_idx[0]
        edges.add(rel, own_e, LOCAL, 1, own_e, 0, flat % s)
    loc.n = n
    return loc


def _heap_rounds(pool: np.ndarray, pool_free: np.ndarray, slots: np.ndarray,
                 blocked: np.ndarray, donor: int) -> tuple[np.ndarray, np.ndarray]:
    """The source unit of each Extend in slot order as the heap of :func:`local.local_dag`
    pops them, and the Extend (position) that read the same unit last (:data:`NONE`: none).

    Keys are ``(free_at, tie)`` and every push while round F is popped lands in a later round,
    so round F is its items in tie order: pool items first, then pushes in push order (a
    source, then the slot it filled). Pushes of round 0 (blocked slots) and of round 1 meet in
    round 2; from round 3 on a round is the last round's sources and slots interleaved."""
    n_slots = slots.size
    out = np.empty(n_slots, dtype=np.int64)
    prev = np.empty(n_slots, dtype=np.int64)
    if not n_slots:
        return out, prev
    p0, p1 = pool[~pool_free], pool[pool_free]
    rounds: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {
        0: [(p0, none_array(p0.size))], 1: [(p1, none_array(p1.size))]}
    pos = 0
    f = 0
    items = last = _EMPTY
    while pos < n_slots:
        chunks = rounds.pop(f, [])
        if len(chunks) == 1:
            items, last = chunks[0]
        elif chunks:
            items = np.concatenate([c[0] for c in chunks])
            last = np.concatenate([c[1] for c in chunks])
        else:
            items = last = _EMPTY
        if f >= 3 and not rounds:
            break
        f += 1
        if not items.size:
            continue
        q = min(items.size, n_slots - pos)
        src = items[:q]
        out[pos:pos + q] = src
        prev[pos:pos + q] = last[:q]
        nxt = np.empty(2 * q, dtype=np.int64)
        nxt[0::2] = src
        nxt[1::2] = slots[pos:pos + q]
        nlast = none_array(2 * q)
        nlast[0::2] = np.arange(pos, pos + q)
        if f == 1:  # round 0: a blocked slot starts at 1, so both land in round 2
            late = blocked[pos:pos + q].repeat(2)
        if donor >= 0 and f <= 2:  # the donor is read once
            keep = nxt != donor
            nxt, nlast = nxt[keep], nlast[keep]
            if f == 1:
                late = late[keep]
        pos += q
        if f == 1 and np.count_nonzero(late):
            early = ~late
            rounds.setdefault(1, []).append((nxt[early], nlast[early]))
            rounds.setdefault(2, []).append((nxt[late], nlast[late]))
        else:
            rounds.setdefault(f, []).append((nxt, nlast))
    while pos < n_slots:  # pure doubling
        q = min(items.size, n_slots - pos)
        out[pos:pos + q] = items[:q]
        prev[pos:pos + q] = last[:q]
        if pos + q >= n_slots:
            break
        nxt = np.empty(2 * q, dtype=np.int64)
        nxt[0::2] = items
        nxt[1::2] = slots[pos:pos + q]
        nlast = none_array(2 * q)
        nlast[0::2] = np.arange(pos, pos + q)
        items, last = nxt, nlast
        pos += q
    return out, prev


def _pick_donor(
    unit_rows: np.ndarray,
    surplus: np.ndarray,
    whole: np.ndarray,
    unfilled_rows: np.ndarray,
    blocked: np.ndarray,
    held: np.ndarray,
    others_need: np.ndarray,
    rank: int,
    ls: Layout,
    t_sub: Layout,
) -> tuple[int, int] | None:
    """:func:`local._pick_donor`: ``(-1, k)`` for ``surplus[k]``, ``(w, j)`` for sub-unit j
    (interleaved) of ``whole[w]``; None when fewer than ``rank + 1`` candidates.

    Slots are pairwise disjoint, so a candidate of s GPUs misses some slot of a kind whenever
    there are more than s of them."""
    s = t_sub.tp * t_sub.pp
    n_held = int(np.count_nonzero(blocked))
    n_free = blocked.size - n_held
    size = held.shape[0]

    def misses(rows: np.ndarray, sel: np.ndarray, count: int) -> np.ndarray:
        if count > s:
            return np.ones(rows.shape[0], dtype=bool)
        if not count:
            return np.zeros(rows.shape[0], dtype=bool)
        ids = np.full(size, -1, dtype=np.int64)
        ids[unfilled_rows[sel]] = np.arange(count)[:, None]
        return _distinct(ids[rows]) < count

    def key(rows: np.ndarray, kind: int) -> np.ndarray:
        """kind·4 + fit·2 + (no other target needs it); -1: not a candidate."""
        if not rows.shape[0]:
            return _EMPTY
        fit = np.where(misses(rows, ~blocked, n_free), 1,
                       np.where(misses(rows, blocked, n_held), 0, -1))
        out: np.ndarray = kind * 4 + fit * 2 + ~others_need[rows].any(1)
        out[fit < 0] = -1
        return out

    k1 = key(unit_rows[surplus], 1)
    if whole.shape[0]:
        wi = sub_index(ls.tp, ls.pp, t_sub.tp, t_sub.pp, INTERLEAVED)
        k0 = key(whole[:, wi].reshape(-1, s), 0)
    else:
        k0 = _EMPTY
    keys = np.concatenate([k1, k0])
    if not keys.size:
        return None
    if rank == 0:  # the first of the best
        k = int(keys.argmax())
        if keys[k] < 0:
            return None
    else:
        ok = (keys >= 0).nonzero()[0]
        if rank >= ok.size:
            return None
        k = int(ok[np.argsort(-keys[ok], kind="stable")[rank]])
    if k < k1.size:
        return -1, k
    per = (ls.tp // t_sub.tp) * (ls.pp // t_sub.pp)
    return (k - k1.size) // per, (k - k1.size) % per


def _distinct(ids: np.ndarray) -> np.ndarray:
    """Per row: how many distinct non-negative ids it holds."""
    srt = np.sort(ids, axis=1)
    out = (srt[:, 0] >= 0).astype(np.int64)
    if srt.shape[1] > 1:
        out += ((srt[:, 1:] != srt[:, :-1]) & (srt[:, 1:] >= 0)).sum(1)
    return out
