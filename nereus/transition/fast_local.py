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
_EMPTY = np.zeros(0, dtype=np.int64)


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

    @property
    def count(self) -> int:
        return int(self.rows.shape[0])


@dataclass
class Edges:
    """Edge arrays with the key ``(section, owner, rank)`` that orders them as the reference
    appends them."""

    a: list[np.ndarray] = field(default_factory=list)
    b: list[np.ndarray] = field(default_factory=list)
    kind: list[np.ndarray] = field(default_factory=list)
    key: list[np.ndarray] = field(default_factory=list)  # sec·2^60 + owner·2^40 + part·2^20 + sub

    def add(self, a: np.ndarray, b: np.ndarray, kind: int, sec: int, owner: np.ndarray,
            part: np.ndarray | int, sub: np.ndarray | int) -> None:
        if a.size:
            self.a.append(a)
            self.b.append(b)
            self.kind.append(np.full(a.size, kind, dtype=np.int8))
            self.key.append((sec << 60) + (owner << 40) + (part << 20) + sub)


@dataclass
class LocalArrays:
    """One model-stage's local DAG (local indices), as :class:`local.LocalDag` holds it."""

    stage: str
    state: str
    blocks: list[Block]
    n: int
    edges: Edges
    release: np.ndarray  # GPU → local index of the Destroy that frees it, -1: none
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
    tab = np.full(size, -1, dtype=np.int64)
    tab[rows[:, 0]] = np.arange(rows.shape[0])
    return tab


def _member(q: np.ndarray, tab: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For each row of ``q`` (…, s): whether it equals a row of ``rows`` (by ``tab``)."""
    if rows.shape[0] == 0:
        return np.zeros(q.shape[:-1], dtype=bool)
    ids = tab[q[..., 0]]
    return (ids >= 0) & (rows[ids] == q).all(-1)


def _row_gpus_any(mask: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return mask[rows].any(-1) if rows.size else np.zeros(rows.shape[0], dtype=bool)


def destroy_only(stage: str, state: str, srcs: np.ndarray, lay: Layout, size: int) -> LocalArrays:
    """A model-stage with nothing to build: every unit is destroyed."""
    n = srcs.shape[0]
    release = np.full(size, -1, dtype=np.int64)
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
    # target slots: per target unit the grouping that lands most parts on source tuples
    ti = sub_index(lt.tp, lt.pp, st, sp, INTERLEAVED)
    slots_i = tgts[:, ti]
    at_sub = ls.tp == st and ls.pp == sp
    if at_sub:
        src_tab = _first_table(srcs, size)
        tables = [(src_tab, srcs)]
    else:
        si = sub_index(ls.tp, ls.pp, st, sp, INTERLEAVED)
        subs_i = srcs[:, si].reshape(-1, s)
        tables = [(_first_table(subs_i, size), subs_i)]
        s_differ = groupings_differ(ls, t_sub)
        if s_differ:
            sc = sub_index(ls.tp, ls.pp, st, sp, CONTIGUOUS)
            subs_c = srcs[:, sc].reshape(-1, s)
            tables.append((_first_table(subs_c, size), subs_c))

    def in_src(q: np.ndarray) -> np.ndarray:
        hit = _member(q, *tables[0])
        for tab, rows in tables[1:]:
            hit |= _member(q, tab, rows)
        return hit

    if groupings_differ(lt, t_sub):
        slots_c = tgts[:, sub_index(lt.tp, lt.pp, st, sp, CONTIGUOUS)]
        tgt_grp = (in_src(slots_c).sum(1) > in_src(slots_i).sum(1)).astype(np.int8)
        slots = np.where(tgt_grp[:, None, None] == 1, slots_c, slots_i)
    else:
        tgt_grp = np.zeros(tgts.shape[0], dtype=np.int8)
        slots = slots_i
    kt = slots.shape[1]
    slot_rows = slots.reshape(-1, s)
    nslots = slot_rows.shape[0]
    slot_tab = _first_table(slot_rows, size)

    blocks: list[Block] = []
    n = 0
    # unit table (layout t_sub): rows and producing primitive (-1: none)
    if at_sub:
        unit_rows = srcs
        kept_hit = _member(srcs, slot_tab, slot_rows)
        split_n = 0
        whole = srcs[:0]
        producer = np.full(srcs.shape[0], -1, dtype=np.int64)
    else:
        hits_i = _member(subs_i, slot_tab, slot_rows).reshape(srcs.shape[0], -1)
        if s_differ:
            hits_c = _member(subs_c, slot_tab, slot_rows).reshape(srcs.shape[0], -1)
            src_grp = (hits_c.sum(1) > hits_i.sum(1)).astype(np.int8)
            chosen = np.where(src_grp[:, None] == 1, hits_c, hits_i)
        else:
            src_grp = np.zeros(srcs.shape[0], dtype=np.int8)
            chosen = hits_i
        split = chosen.any(1)
        split_n = int(split.sum())
        whole = srcs[~split]
        k_sub = chosen.shape[1]
        if split_n:
            srows = srcs[split]
            sgrp = src_grp[split]
            blocks.append(Block(SPLIT, 0, srows, ls, t_sub, grouping=sgrp))
            n = split_n
            subs3 = np.where(sgrp[:, None, None] == 1,
                             srows[:, sc] if s_differ else 0, srows[:, si])
            unit_rows = subs3.reshape(-1, s)
            kept_hit = chosen[split].reshape(-1)
            producer = np.repeat(np.arange(split_n), k_sub)
        else:
            unit_rows = np.zeros((0, s), dtype=np.int64)
            kept_hit = np.zeros(0, dtype=bool)
            producer = _EMPTY
    n_base = unit_rows.shape[0]
    kept = np.flatnonzero(kept_hit)
    surplus = np.flatnonzero(~kept_hit)
    # slots: ids n_base + slot index; kept slots are units already
    slot_unit = np.arange(n_base, n_base + nslots)
    kept_slot = slot_tab[unit_rows[kept, 0]] if kept.size else _EMPTY
    slot_unit[kept_slot] = kept
    unfilled_mask = np.ones(nslots, dtype=bool)
    unfilled_mask[kept_slot] = False
    unfilled = np.flatnonzero(unfilled_mask)
    blocked_all = held[slot_rows[unfilled]].any(1) if unfilled.size else np.zeros(0, bool)
    unfilled = np.concatenate([unfilled[~blocked_all], unfilled[blocked_all]])
    blocked = np.concatenate([np.zeros(int((~blocked_all).sum()), np.int64),
                              np.ones(int(blocked_all.sum()), np.int64)])
    rep_rows = replicas if lt.tp == st and lt.pp == sp and replicas.size \
        else np.zeros((0, s), np.int64)
    rep_base = n_base + nslots
    rows_parts = [unit_rows, slot_rows, rep_rows]
    prod_parts = [producer, np.full(nslots + rep_rows.shape[0], -1, dtype=np.int64)]
    n_units = rep_base + rep_rows.shape[0]
    # the pool: kept units, surplus units on GPUs no target needs, units already in place
    free_sur = surplus[~_row_gpus_any(target_gpus, unit_rows[surplus])] if surplus.size \
        else _EMPTY
    pool = np.concatenate([kept, free_sur, np.arange(rep_base, n_units)])
    pool_free = np.concatenate([(producer[kept] >= 0).astype(np.int64),
                                np.zeros(free_sur.size + rep_rows.shape[0], np.int64)])
    loc = LocalArrays(stage, state, blocks, n, Edges(), np.full(size, -1, dtype=np.int64),
                      t_sub=t_sub)
    donor = -1
    edges = loc.edges
    staged_ext = -1
    if unfilled.size and not pool.size:
        own = np.zeros(size, dtype=bool)
        own[tgts] = True
        picked = _pick_donor(unit_rows, surplus, whole, slot_rows[unfilled], held,
                             target_gpus & ~own, donor_rank, ls, t_sub, size)
        if picked is None:
            return None
        from_whole, which = picked
        if from_whole >= 0:  # split its parent (interleaved) and keep the other parts surplus
            parent = whole[from_whole]
            keep = np.ones(whole.shape[0], dtype=bool)
            keep[from_whole] = False
            whole = whole[keep]
            blocks.append(Block(SPLIT, n, parent[None, :], ls, t_sub,
                                grouping=np.zeros(1, dtype=np.int8)))
            subs = parent[sub_index(ls.tp, ls.pp, st, sp, INTERLEAVED)]
            ids = np.arange(n_units, n_units + subs.shape[0])
            rows_parts.append(subs)
            prod_parts.append(np.full(subs.shape[0], n, dtype=np.int64))
            n_units += subs.shape[0]
            n += 1
            donor = int(ids[which])
            surplus = np.concatenate([surplus, np.delete(ids, which)])
        else:
            donor = int(surplus[which])
            surplus = np.concatenate([surplus[surplus != donor]])
        surplus = np.concatenate([surplus, [donor]])
        loc.donor = True
        all_prod = np.concatenate(prod_parts)
        if len(staging) == s:
            stage_rows = np.array([staging], dtype=np.int64)
            e0 = n
            blocks.append(Block(EXTEND, n, np.concatenate(rows_parts)[[donor]], t_sub,
                                new=stage_rows))
            n += 1
            if all_prod[donor] >= 0:
                edges.add(all_prod[[donor]], np.array([e0]), DATA, 0, np.array([e0]), 0, 0)
            rows_parts.append(stage_rows)
            prod_parts.append(np.array([e0], dtype=np.int64))
            stage_id = n_units
            n_units += 1
            surplus = np.concatenate([surplus, [stage_id]])
            pool = np.array([stage_id], dtype=np.int64)
            pool_free = np.ones(1, dtype=np.int64)
            staged_ext = stage_id  # read by e0 already
            loc.staged = True
            loc.staging = staging
        else:
            pool = np.array([donor], dtype=np.int64)
            pool_free = np.array([1 if all_prod[donor] >= 0 else 0], dtype=np.int64)
    all_rows = np.concatenate(rows_parts) if len(rows_parts) > 1 else rows_parts[0]
    all_prod = np.concatenate(prod_parts)
    if load is not None and pool.size > 1:
        worst = load[all_rows[pool]].max(1)
        perm = np.lexsort((worst, pool_free))
        pool, pool_free = pool[perm], pool_free[perm]
    if donor >= 0 and not loc.staged and unfilled.size and \
            np.isin(all_rows[donor], slot_rows[unfilled[0]]).any():
        return None  # the donor (the heap's only item) overlaps the first slot
    # the broadcast heap, a round at a time
    ext_src, ext_slot = _heap_rounds(pool, pool_free, unfilled + n_base, blocked,
                                     donor if not loc.staged else -1)
    if ext_src is None:
        return None
    n_ext = ext_src.size
    ext0 = n
    if n_ext:
        blocks.append(Block(EXTEND, n, all_rows[ext_src], t_sub, new=all_rows[ext_slot]))
        ext_idx = np.arange(n, n + n_ext)
        all_prod[ext_slot] = ext_idx
        n += n_ext
        p = all_prod[ext_src]
        has = p >= 0
        edges.add(p[has], ext_idx[has], DATA, 0, ext_idx[has], 0, 0)
        # order: the previous Extend reading the same source
        by_src = np.argsort(ext_src, kind="stable")
        same = ext_src[by_src[1:]] == ext_src[by_src[:-1]]
        after = by_src[1:][same]
        edges.add(ext_idx[by_src[:-1][same]], ext_idx[after], ORDER, 0, ext_idx[after], 0, 1)
    else:
        ext_idx = _EMPTY
    reads_src = ext_src if staged_ext < 0 else np.concatenate([[donor], ext_src])
    reads_ext = ext_idx if staged_ext < 0 else np.concatenate([[ext0 - 1], ext_idx])
    # Destroys: surplus units (after their producer and readers), then whole units
    if surplus.size:
        d_idx = np.arange(n, n + surplus.size)
        blocks.append(Block(DESTROY, n, all_rows[surplus], t_sub))
        p = all_prod[surplus]
        has = p >= 0
        edges.add(p[has], d_idx[has], DATA, 0, d_idx[has], 0, 0)
        _reader_edges(edges, surplus, d_idx, None, reads_src, reads_ext, n_units)
        loc.release[all_rows[surplus]] = d_idx[:, None]
        n += surplus.size
    if whole.shape[0]:
        d_idx = np.arange(n, n + whole.shape[0])
        blocks.append(Block(DESTROY, n, whole, ls))
        loc.release[whole] = d_idx[:, None]
        n += whole.shape[0]
    # Merges: every target unit not at t_sub, from its parts
    if not (lt.tp == st and lt.pp == sp):
        m_idx = np.arange(n, n + tgts.shape[0])
        blocks.append(Block(MERGE, n, tgts, lt, t_sub, grouping=tgt_grp))
        parts = slot_unit.reshape(-1, kt)  # (targets × parts) unit ids
        p = all_prod[parts]
        has = p >= 0
        part_no = np.broadcast_to(np.arange(kt), parts.shape)
        owner = np.broadcast_to(m_idx[:, None], parts.shape)
        edges.add(p[has], owner[has], DATA, 0, owner[has], part_no[has], 0)
        _reader_edges(edges, parts.reshape(-1), owner.reshape(-1), part_no.reshape(-1),
                      reads_src, reads_ext, n_units)
        n += tgts.shape[0]
    # local: a GPU an Extend acquires waits for the Destroy of this model-stage that frees it
    if n_ext:
        new = all_rows[ext_slot]
        rel = loc.release[new]  # (n_ext × s)
        has = rel >= 0
        if has.any():
            gone_rows = _destroy_rows(blocks, rel, s)
            same_unit = (gone_rows == new[:, None, :]).all(-1) & (gone_rows[..., 0] >= 0)
            has &= ~same_unit
            owner = np.broadcast_to(ext_idx[:, None], rel.shape)
            rank = np.broadcast_to(np.arange(s), rel.shape)
            edges.add(rel[has], owner[has], LOCAL, 1, owner[has], 0, rank[has])
    loc.n = n
    return loc


def _destroy_rows(blocks: list[Block], rel: np.ndarray, s: int) -> np.ndarray:
    """Per entry of ``rel`` (local Destroy indices) the destroyed unit's GPUs when it has ``s``
    of them (-1 rows otherwise)."""
    out = np.full((*rel.shape, s), -1, dtype=np.int64)
    for blk in blocks:
        if blk.kind != DESTROY or blk.rows.shape[1] != s:
            continue
        inside = (rel >= blk.start) & (rel < blk.start + blk.count)
        out[inside] = blk.rows[rel[inside] - blk.start]
    return out


def _reader_edges(edges: Edges, units: np.ndarray, owners: np.ndarray, parts: np.ndarray | None,
                  reads_src: np.ndarray, reads_ext: np.ndarray, n_units: int) -> None:
    """``Extend → owner`` "data" edges for every Extend reading ``units[k]`` (owner
    ``owners[k]``, part ``parts[k]``), in Extend order."""
    if not reads_src.size or not units.size:
        return
    slot_of = np.full(n_units, -1, dtype=np.int64)
    slot_of[units] = np.arange(units.size)
    k = slot_of[reads_src]
    hit = k >= 0
    if not hit.any():
        return
    k, ext = k[hit], reads_ext[hit]
    edges.add(ext, owners[k], DATA, 0, owners[k], 0 if parts is None else parts[k], 1 + ext)


def _heap_rounds(pool: np.ndarray, pool_free: np.ndarray, slots: np.ndarray,
                 blocked: np.ndarray, donor: int) -> tuple[np.ndarray, np.ndarray] | tuple[
                     None, None]:
    """(source unit, slot unit) of each Extend in slot order, as the heap of
    :func:`local.local_dag` pops them; (None, None) when the donor overlaps the first slot
    (checked by the caller's rows: here the pool's only item is the donor then)."""
    n_slots = slots.size
    if not n_slots:
        return _EMPTY, _EMPTY
    rounds: dict[int, list[np.ndarray]] = {0: [pool[pool_free == 0]], 1: [pool[pool_free == 1]]}
    srcs: list[np.ndarray] = []
    outs: list[np.ndarray] = []
    pos = 0
    f = 0
    while pos < n_slots:
        chunks = rounds.pop(f, None)
        items = np.concatenate(chunks) if chunks else _EMPTY
        if not items.size:
            f += 1
            continue
        q = min(items.size, n_slots - pos)
        src, sl = items[:q], slots[pos:pos + q]
        srcs.append(src)
        outs.append(sl)
        start = np.maximum(blocked[pos:pos + q], f)
        pos += q
        pushed = np.stack([src, sl], axis=1).reshape(-1)
        when = np.repeat(start + 1, 2)
        if donor >= 0:
            keep = pushed != donor
            pushed, when = pushed[keep], when[keep]
        if f == 0:
            for r in (1, 2):
                sel = pushed[when == r]
                if sel.size:
                    rounds.setdefault(r, []).append(sel)
        else:
            rounds.setdefault(f + 1, []).append(pushed)
        f += 1
    return np.concatenate(srcs), np.concatenate(outs)


def _pick_donor(
    unit_rows: np.ndarray,
    surplus: np.ndarray,
    whole: np.ndarray,
    unfilled_rows: np.ndarray,
    held: np.ndarray,
    others_need: np.ndarray,
    rank: int,
    ls: Layout,
    t_sub: Layout,
    size: int,
) -> tuple[int, int] | None:
    """:func:`local._pick_donor`: ``(-1, k)`` for ``surplus[k]``, ``(w, j)`` for sub-unit j
    (interleaved) of ``whole[w]``; None when fewer than ``rank + 1`` candidates."""
    free = ~held[unfilled_rows].any(1)
    n_free = int(free.sum())
    n_held = free.size - n_free
    free_id = np.full(size, -1, dtype=np.int64)
    held_id = np.full(size, -1, dtype=np.int64)
    free_id[unfilled_rows[free]] = np.arange(n_free)[:, None]
    held_id[unfilled_rows[~free]] = np.arange(n_held)[:, None]

    def scores(cands: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        fit = np.full(cands.shape[0], -1, dtype=np.int64)
        if not cands.shape[0]:
            return fit, fit
        fit[_distinct(held_id[cands]) < n_held] = 0
        fit[_distinct(free_id[cands]) < n_free] = 1
        need = np.where(others_need[cands].any(1), 0, 1)
        return fit, need

    sur_rows = unit_rows[surplus]
    f1, n1 = scores(sur_rows)
    if whole.shape[0]:
        wi = sub_index(ls.tp, ls.pp, t_sub.tp, t_sub.pp, INTERLEAVED)
        wsubs = whole[:, wi].reshape(-1, t_sub.tp * t_sub.pp)
    else:
        wsubs = np.zeros((0, t_sub.tp * t_sub.pp), dtype=np.int64)
    f0, n0 = scores(wsubs)
    ok1, ok0 = f1 >= 0, f0 >= 0
    kind = np.concatenate([np.ones(int(ok1.sum()), np.int64), np.zeros(int(ok0.sum()), np.int64)])
    fit = np.concatenate([f1[ok1], f0[ok0]])
    need = np.concatenate([n1[ok1], n0[ok0]])
    where = np.concatenate([np.flatnonzero(ok1), np.flatnonzero(ok0)])
    if rank >= kind.size:
        return None
    # descending by (kind, fit, need), stable: ascending on the negated key
    perm = np.lexsort((-need, -fit, -kind))
    k = int(perm[rank])
    if kind[k] == 1:
        return -1, int(where[k])
    per = wi.shape[0]
    return int(where[k]) // per, int(where[k]) % per


def _distinct(ids: np.ndarray) -> np.ndarray:
    """Per row: how many distinct non-negative ids it holds."""
    srt = np.sort(ids, axis=1)
    out = (srt[:, 0] >= 0).astype(np.int64)
    if srt.shape[1] > 1:
        out += ((srt[:, 1:] != srt[:, :-1]) & (srt[:, 1:] >= 0)).sum(1)
    return out
