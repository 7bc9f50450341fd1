"""Joining batched local DAGs into the global DAG (:func:`compile._assemble` on arrays), the
batched DAG record, and its expansion into a :class:`TransitionDag`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from nereus.emu.regions import new_emu
from nereus.emu.unit import Emu, Layout
from nereus.transition.batched.blocks import (
    DESTROY,
    EDGE_CODES,
    EXTEND,
    RESOURCE,
    Block,
    LocalArrays,
)
from nereus.transition.batched.expand import local_edge_arrays, local_records
from nereus.transition.dag import TransitionDag
from nereus.transition.graph import Levels, cycle_names, default_stage_rank, levels, priority_order
from nereus.transition.residency import Exclusion


@dataclass(frozen=True)
class BatchedDag:
    """The global DAG with primitives in blocks and edges as arrays.

    ``source``/``target``: the units, or (model-stage, state, layout, GPU rows) per model-stage
    in unit order, built into units when expanding. Primitive indices are those of the expanded DAG: the local DAGs of ``names`` one after
    another (``offsets``). Edges: each local DAG's, the resource edges (``res_a → res_b``, once
    per GPU the Destroy frees for the Extend: made unique when expanding), then
    ``extra_a → extra_b`` (the "memory" edges of co-resident model-stages, tuples in
    :attr:`extra`). ``topo`` levels all of them.
    """

    source: tuple[Emu, ...] | tuple[tuple[str, str, Layout, np.ndarray], ...]
    target: tuple[Emu, ...] | tuple[tuple[str, str, Layout, np.ndarray], ...]
    names: tuple[str, ...]
    stages: tuple[LocalArrays, ...]
    offsets: tuple[int, ...]
    n: int
    res_a: np.ndarray
    res_b: np.ndarray
    blocks: tuple[tuple[int, Block, int, int], ...]  # (offset, block, state bytes, replicated)
    ranks: tuple[int, ...]
    topo: Levels
    t_sub: tuple[tuple[str, int, int], ...]
    conflicts: frozenset[tuple[str, str]] | None
    state_bytes: tuple[tuple[str, int], ...]
    replicated_bytes: tuple[tuple[str, int], ...]
    extra_a: np.ndarray | None = None  # the memory edges extra_a → extra_b, if any
    extra_b: np.ndarray | None = None

    @property
    def extra(self) -> tuple[tuple[int, int, str], ...]:
        """The "memory" edges as the expanded DAG lists them."""
        if self.extra_a is None or self.extra_b is None:
            return ()
        return tuple(zip(self.extra_a.tolist(), self.extra_b.tolist(),
                         ("memory",) * self.extra_a.size, strict=True))

    @property
    def sizes(self) -> dict[str, tuple[int, int]]:
        rep = dict(self.replicated_bytes)
        return {m: (b, rep.get(m, 0)) for m, b in self.state_bytes}


def _edges(locs: Sequence[LocalArrays], offsets: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    a: list[np.ndarray] = []
    b: list[np.ndarray] = []
    shift: list[int] = []
    for loc, off in zip(locs, offsets, strict=True):
        for c in loc.edges.chunks:
            a.append(c[0])
            b.append(c[1])
            shift.append(off)
    if not a:
        z = np.zeros(0, dtype=np.int64)
        return z, z
    add = np.array(shift, dtype=np.int64).repeat([x.size for x in a])
    aa, bb = np.concatenate(a) + add, np.concatenate(b) + add
    keep = (aa >= 0) & (bb >= 0)
    return aa[keep], bb[keep]


def assemble(
    source: tuple[Emu, ...] | tuple[tuple[str, str, Layout, np.ndarray], ...],
    target: tuple[Emu, ...] | tuple[tuple[str, str, Layout, np.ndarray], ...],
    names: list[str],
    locs: Mapping[str, LocalArrays],
    rank: Mapping[str, int],
    excl: Exclusion,
    state_of: Mapping[str, int],
    rep_of: Mapping[str, int],
    with_rep: bool,
) -> tuple[BatchedDag, list[str]]:
    """The global DAG of the chosen local DAGs, and the model-stages along a circular wait
    (empty when there is none)."""
    stages = tuple(locs[m] for m in names)
    offsets: list[int] = []
    n = 0
    for loc in stages:
        offsets.append(n)
        n += loc.n
    # release: per model-stage that destroys anything, and GPU, the global index of the
    # Destroy that frees it
    kinds = [[blk.kind for blk in loc.blocks] for loc in stages]
    freeing = [k for k, ks in enumerate(kinds) if DESTROY in ks]
    res_a: list[np.ndarray] = []
    res_b: list[np.ndarray] = []
    every = excl.pairs is None
    if freeing:
        rel = np.empty((len(freeing), stages[0].release.size), dtype=np.int64)
        for r, k in enumerate(freeing):
            np.add(stages[k].release, offsets[k], out=rel[r])
        rel[rel < 0] = -1
    for k, (m, loc, off) in enumerate(zip(names, stages, offsets, strict=True)):
        if not freeing or EXTEND not in kinds[k]:
            continue
        if every:  # every other model-stage conflicts
            rows = [r for r, j in enumerate(freeing) if j != k]
        else:
            rows = [r for r, j in enumerate(freeing) if excl.conflicts(names[j], m)]
        if not rows:
            continue
        sub = rel.take(rows, axis=0) if len(rows) < len(freeing) else rel
        for blk in loc.blocks:
            if blk.kind != EXTEND:
                continue
            assert blk.new is not None
            d = sub.take(blk.new, axis=1)  # (stages × Extends × GPUs)
            has = d >= 0
            got = has.nonzero()
            if got[0].size:
                res_a.append(d[got])
                res_b.append(got[1] + (off + blk.start))
    # raw: an Extend meets a Destroy once per GPU it frees (sorted and made unique when
    # expanding; duplicates change neither depth nor critical path)
    res_a_arr = np.concatenate(res_a) if res_a else np.zeros(0, dtype=np.int64)
    res_b_arr = np.concatenate(res_b) if res_b else np.zeros(0, dtype=np.int64)
    la, lb = _edges(stages, offsets)
    a, b = np.concatenate([la, res_a_arr]), np.concatenate([lb, res_b_arr])
    topo = levels(n, a, b)
    blocks = tuple((off, blk, state_of[m], rep_of[m])
                   for m, loc, off in zip(names, stages, offsets, strict=True)
                   for blk in loc.blocks)
    dag = BatchedDag(
        source, target, tuple(names), stages, tuple(offsets), n, res_a_arr, res_b_arr,
        blocks, tuple(rank.get(m, default_stage_rank(m)) for m in names), topo,
        tuple((m, lay.tp, lay.pp) for m in names if (lay := locs[m].t_sub) is not None),
        excl.pairs, tuple((m, state_of[m]) for m in sorted(names)),
        tuple((m, rep_of[m]) for m in sorted(names)) if with_rep else ())
    if topo.ok:
        return dag, []
    assert topo.level is not None
    return dag, cycle_names(n, a, b, topo.level, names, offsets)


def _emus_of(units: tuple[Emu, ...] | tuple[tuple[str, str, Layout, np.ndarray], ...]
             ) -> tuple[Emu, ...]:
    out: list[Emu] = []
    for u in units:
        if isinstance(u, Emu):
            out.append(u)
        else:
            m, state, lay, rows = u
            out += [new_emu(m, state, lay, tuple(r)) for r in rows.tolist()]
    return tuple(out)


def expand(b: BatchedDag) -> TransitionDag:
    """The per-primitive DAG (what :func:`compile.compile_transition` returns)."""
    sizes = b.sizes
    prims = []
    edges: list[tuple[int, int, str]] = []
    keys: list[tuple[int, int, str, int]] = []
    for m, loc, off, srank in zip(b.names, b.stages, b.offsets, b.ranks, strict=True):
        sb, rep = sizes[m]
        recs = local_records(loc, sb, rep)
        prims += recs
        for blk in loc.blocks:
            keys += [(blk.kind, srank, m, off + blk.start + j) for j in range(blk.count)]
        la, lb, lk = local_edge_arrays(loc)
        edges += [(x + off, y + off, EDGE_CODES[z])
                  for x, y, z in zip(la.tolist(), lb.tolist(), lk.tolist(), strict=True)]
    kind = EDGE_CODES[RESOURCE]
    keys_res = np.unique(b.res_b * max(b.n, 1) + b.res_a)  # by Extend, then Destroy
    edges += [(x, y, kind) for x, y in zip((keys_res % max(b.n, 1)).tolist(),
                                           (keys_res // max(b.n, 1)).tolist(), strict=True)]
    edges = list(dict.fromkeys(edges))
    extra = b.extra
    order = priority_order(b.n, edges + list(extra), keys)
    dag = TransitionDag(_emus_of(b.source), _emus_of(b.target), tuple(prims), tuple(edges),
                        tuple(order), b.t_sub, b.conflicts, b.state_bytes, b.replicated_bytes)
    if extra:
        dag = replace(dag, edges=dag.edges + extra)
    return dag
