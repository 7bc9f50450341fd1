"""One model-stage's local DAG over GPU arrays: :func:`local.local_dag` without per-record work.

The same decisions in the same order — sub-unit grouping per unit, kept / surplus / whole units,
unfilled slots (free GPUs first), the donor, the Extends' sources from the broadcast heap, the
Destroys, the Merges and every edge — computed on integer matrices of GPU ids (one row per unit)
for a model-stage whose source units share one layout and whose target units share one layout
(what placed plans give). Primitives come in *blocks* (:mod:`fast_blocks`): consecutive local
indices of one kind and layout pair, a row per primitive; :mod:`expand` turns them into the
records of :mod:`primitives`. Edges carry a sort key that reproduces the reference's edge order.
The Extends' sources and the donor come from :mod:`fast_sources`.
"""

from __future__ import annotations

import numpy as np

from nereus.emu.regions import groupings_differ
from nereus.emu.unit import Layout
from nereus.transition.batched.blocks import (
    CONTIGUOUS,
    DATA,
    DESTROY,
    EMPTY,
    EXTEND,
    INTERLEAVED,
    LOCAL,
    MERGE,
    ORDER,
    SPLIT,
    Block,
    LocalArrays,
    block,
    iota,
    minus_ones,
    new_local,
    none_array,
    row_all,
    row_any,
    sub_index,
)
from nereus.transition.batched.sources import heap_rounds, pick_donor


def _first_table(rows: np.ndarray, size: int) -> np.ndarray:
    """GPU → index of the row starting at it (rows pairwise disjoint), -1 elsewhere."""
    tab = minus_ones(size)
    tab[rows[:, 0]] = iota(0, rows.shape[0])
    return tab


def _member(q: np.ndarray, tab: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For each row of ``q`` (…, s): whether it equals a row of ``rows`` (by ``tab``)."""
    if not rows.shape[0]:
        return np.zeros(q.shape[:-1], dtype=bool)
    ids = tab.take(q[..., 0])
    if rows.shape[1] == 1:  # a one-GPU row equals the row starting at its GPU
        out: np.ndarray = ids >= 0
        return out
    hit = row_all(rows.take(ids, axis=0) == q)
    hit &= ids >= 0
    return hit


def destroy_only(stage: str, state: str, srcs: np.ndarray, lay: Layout, size: int) -> LocalArrays:
    """A model-stage with nothing to build: every unit is destroyed."""
    n = srcs.shape[0]
    release = none_array(size)
    release[srcs] = iota(0, n)[:, None]
    return new_local(stage, state, [block(DESTROY, 0, srcs, lay)] if n else [], n, release)


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
        slots_i = tgts.take(sub_index(lt.tp, lt.pp, st, sp, INTERLEAVED), axis=1)
        kt = slots_i.shape[1]
        if groupings_differ(lt, t_sub):
            slots_c = tgts.take(sub_index(lt.tp, lt.pp, st, sp, CONTIGUOUS), axis=1)
            tables = []
            if at_sub:
                tables.append((_first_table(srcs, size), srcs))
            else:
                for g in (INTERLEAVED, CONTIGUOUS) if s_differ else (INTERLEAVED,):
                    rows = srcs.take(sub_index(ls.tp, ls.pp, st, sp, g), axis=1).reshape(-1, s)
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
        subs = srcs.take(si, axis=1)
        hits = _member(subs, slot_tab, slot_rows)
        grp = None
        src_contig = False
        if s_differ:
            subs_c = srcs.take(sub_index(ls.tp, ls.pp, st, sp, CONTIGUOUS), axis=1)
            hits_c = _member(subs_c, slot_tab, slot_rows)
            grp = (np.add.reduce(hits_c, axis=1) > np.add.reduce(hits, axis=1)).astype(np.int8)
            pick = grp == 1
            if np.count_nonzero(pick):
                src_contig = True
                subs = np.where(pick[:, None, None], subs_c, subs)
                hits = np.where(pick[:, None], hits_c, hits)
        split = row_any(hits)
        split_n = int(np.count_nonzero(split))
        if split_n == nsrc:
            srows = srcs
        else:
            whole = srcs.compress(~split, axis=0)
            srows, subs = srcs.compress(split, axis=0), subs.compress(split, axis=0)
            hits = hits.compress(split, axis=0)
            if grp is not None:
                grp = grp[split]
        unit_rows = subs.reshape(-1, s)
        kept_hit = hits.reshape(-1)
        producer = iota(0, split_n).repeat(subs.shape[1])
        if split_n:
            blocks.append(block(SPLIT, 0, srows, ls, t_sub, grouping=grp if grp is not None
                                else np.zeros(split_n, dtype=np.int8),
                                contiguous=src_contig and grp is not None
                                and bool(np.count_nonzero(grp))))
            n = split_n
    n_base = unit_rows.shape[0]
    kept = kept_hit.nonzero()[0]
    surplus = (~kept_hit).nonzero()[0]
    # slots: ids n_base + slot index; a kept slot is the unit already there
    slot_unit = np.arange(n_base, n_base + nslots)
    if kept.size:
        kept_slot = slot_tab[unit_rows[:, 0][kept]]
        slot_unit[kept_slot] = kept
    if kept.size == nslots:  # each kept unit is a distinct slot: all slots hold theirs
        unfilled = blocked = EMPTY
        unfilled_rows = slot_rows[:0]
    else:
        unfilled_mask = np.empty(nslots, dtype=bool)
        unfilled_mask.fill(True)
        if kept.size:
            unfilled_mask[kept_slot] = False
        unfilled = unfilled_mask.nonzero()[0]
        blocked = row_any(held.take(slot_rows.take(unfilled, axis=0)))
        n_blocked = int(np.count_nonzero(blocked))
        if n_blocked and n_blocked < unfilled.size:  # free GPUs first (stable)
            unfilled = np.concatenate([unfilled[~blocked], unfilled[blocked]])
            blocked = np.concatenate([np.zeros(unfilled.size - n_blocked, dtype=bool),
                                      np.ones(n_blocked, dtype=bool)])
        unfilled_rows = slot_rows.take(unfilled, axis=0)  # the GPUs each Extend fills, in order
    loc = new_local(stage, state, blocks, n, none_array(size), t_sub)
    edges = loc.edges
    donor = -1
    staged = -1  # the staged copy's id
    e0 = -1
    if not unfilled.size:  # every slot holds its unit already: no Extends
        all_rows, all_prod, n_units = unit_rows, producer, n_base
        ext_src = ext_prev = slot_ids = EMPTY
    else:
        has_rep = lt_sub and replicas.shape[0] > 0
        n_units = n_base + nslots + (replicas.shape[0] if has_rep else 0)
        # the pool: kept units, surplus units on GPUs no target needs, units already in place
        pool = kept
        pool_free = producer[kept] >= 0
        if surplus.size:
            free_sur = surplus[~row_any(target_gpus.take(unit_rows.take(surplus, axis=0)))]
            if free_sur.size:
                pool = np.concatenate([pool, free_sur])
                pool_free = np.concatenate([pool_free, np.zeros(free_sur.size, dtype=bool)])
        if has_rep:
            pool = np.concatenate([pool, iota(n_base + nslots, n_units)])
            pool_free = np.concatenate([pool_free, np.zeros(replicas.shape[0], dtype=bool)])
        rows_parts = [unit_rows, slot_rows] + ([replicas] if has_rep else [])
        prod_parts = [producer, none_array(n_units - n_base)]
        if not pool.size:
            own = np.zeros(size, dtype=bool)
            own[tgts] = True
            picked = pick_donor(unit_rows, surplus, whole, unfilled_rows, blocked, held,
                                 target_gpus & ~own, donor_rank, ls, t_sub)
            if picked is None:
                return None
            from_whole, which = picked
            if from_whole >= 0:  # split its parent (interleaved) and keep the other parts surplus
                parent = whole[from_whole]
                whole = np.delete(whole, from_whole, axis=0)
                blocks.append(block(SPLIT, n, parent[None, :], ls, t_sub,
                                    grouping=np.zeros(1, dtype=np.int8)))
                subs = parent[sub_index(ls.tp, ls.pp, st, sp, INTERLEAVED)]
                ids = iota(n_units, n_units + subs.shape[0])
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
                blocks.append(block(EXTEND, n, donor_row[None, :], t_sub, new=stage_rows))
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
                set(all_rows[donor].tolist()).isdisjoint(unfilled_rows[0].tolist()):
            return None  # the donor (the heap's only item) overlaps the first slot
        if load is not None and pool.size > 1:
            perm = np.lexsort((load[all_rows[pool]].max(1), pool_free))
            pool, pool_free = pool[perm], pool_free[perm]
        # the broadcast heap, a round at a time; the j-th Extend fills the j-th unfilled slot
        slot_ids = unfilled + n_base
        ext_src, ext_prev = heap_rounds(pool, pool_free, slot_ids, blocked,
                                         donor if staged < 0 else -1)
    n_ext = ext_src.size
    readers = n_ext > 0 or e0 >= 0
    if readers:
        owner = none_array(n_units)  # unit → the Destroy or Merge it feeds
        part_of = np.zeros(n_units, dtype=np.int64)
    ext_idx = iota(n, n + n_ext)
    if n_ext:
        blocks.append(block(EXTEND, n, all_rows.take(ext_src, axis=0), t_sub, new=unfilled_rows))
        all_prod[slot_ids] = ext_idx
        edges.add(all_prod[ext_src], ext_idx, DATA, 0, ext_idx, 0, 0)
        # order: the previous Extend reading the same source
        edges.add(ext_prev + n, ext_idx, ORDER, 0, ext_idx, 0, 1)
        n += n_ext
    # Destroys: surplus units (after their producer and readers), then whole units
    if surplus.size:
        d_idx = iota(n, n + surplus.size)
        rows = all_rows.take(surplus, axis=0)
        blocks.append(block(DESTROY, n, rows, t_sub))
        edges.add(all_prod[surplus], d_idx, DATA, 0, d_idx, 0, 0)
        if readers:
            owner[surplus] = d_idx
        loc.release[rows] = d_idx[:, None]
        n += surplus.size
    if whole.shape[0]:
        d_idx = iota(n, n + whole.shape[0])
        blocks.append(block(DESTROY, n, whole, ls))
        loc.release[whole] = d_idx[:, None]
        n += whole.shape[0]
    # Merges: every target unit not at t_sub, from its parts
    if not lt_sub:
        nt = tgts.shape[0]
        assert tgt_grp is not None
        blocks.append(block(MERGE, n, tgts, lt, t_sub, grouping=tgt_grp, contiguous=tgt_contig))
        parts = slot_unit  # (targets × parts) unit ids, flat
        flat = iota(0, nt * kt)
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
        rel = loc.release.take(unfilled_rows).reshape(-1)  # (Extends × GPUs), flat
        flat = iota(0, n_ext * s)
        own_e = flat // s + ext_idx[0]
        edges.add(rel, own_e, LOCAL, 1, own_e, 0, flat % s)
    loc.n = n
    return loc
