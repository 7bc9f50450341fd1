"""Batched DAG → the per-primitive records of :mod:`primitives` (what the executor and the wire
format consume). Only the transition that is executed needs this; planning does not."""

from __future__ import annotations

import numpy as np

from nereus.emu.primitives import Destroy, Extend, Merge, Primitive, Split, record
from nereus.emu.regions import new_emu
from nereus.emu.unit import Emu, Layout
from nereus.transition.batched.blocks import (
    CONTIGUOUS,
    DESTROY,
    EXTEND,
    MERGE,
    SPLIT,
    Block,
    LocalArrays,
    sub_index,
)

_GROUPING = ("interleaved", "contiguous")


def _emus(stage: str, state: str, lay: Layout, rows: np.ndarray) -> list[Emu]:
    return [new_emu(stage, state, lay, tuple(r)) for r in rows.tolist()]


def block_records(stage: str, state: str, state_bytes: int, rep: int, blk: Block
                  ) -> list[Primitive]:
    """The records of one block, in local index order."""
    if blk.kind == DESTROY:
        return [record(Destroy, u, state_bytes, rep)
                for u in _emus(stage, state, blk.lay, blk.rows)]
    if blk.kind == EXTEND:
        assert blk.new is not None
        return [record(Extend, a, b, state_bytes, rep) for a, b in
                zip(_emus(stage, state, blk.lay, blk.rows),
                    _emus(stage, state, blk.lay, blk.new), strict=True)]
    sub = blk.sub
    assert sub is not None and blk.grouping is not None
    lay = blk.lay
    k = (lay.tp // sub.tp) * (lay.pp // sub.pp)
    units = _emus(stage, state, lay, blk.rows)
    parts = [
        _emus(stage, state, sub, blk.rows[:, sub_index(lay.tp, lay.pp, sub.tp, sub.pp, g)]
              .reshape(-1, sub.tp * sub.pp))
        for g in (0, 1) if g == 0 or bool((blk.grouping == CONTIGUOUS).any())
    ]
    out: list[Primitive] = []
    for j, (u, g) in enumerate(zip(units, blk.grouping.tolist(), strict=True)):
        subs = tuple(parts[g][j * k:(j + 1) * k])
        if blk.kind == SPLIT:
            out.append(record(Split, u, subs, state_bytes, _GROUPING[g], rep))
        else:
            assert blk.kind == MERGE
            out.append(record(Merge, subs, u, state_bytes, _GROUPING[g], rep))
    return out


def local_records(loc: LocalArrays, state_bytes: int, rep: int) -> list[Primitive]:
    out: list[Primitive] = []
    for blk in loc.blocks:
        out += block_records(loc.stage, loc.state, state_bytes, rep, blk)
    return out


def local_edge_arrays(loc: LocalArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(before, after, kind code) in the order the reference appends them."""
    chunks = loc.edges.chunks
    if not chunks:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z.astype(np.int8)
    a = np.concatenate([c[0] for c in chunks])
    b = np.concatenate([c[1] for c in chunks])
    kind = np.concatenate([np.full(c[0].size, c[2], dtype=np.int8) for c in chunks])
    key = np.concatenate([(np.int64(c[3]) << 60) + (c[4] << 40) + (np.asarray(c[5]) << 20)
                          + np.asarray(c[6]) for c in chunks])
    keep = (a >= 0) & (b >= 0)
    a, b, kind, key = a[keep], b[keep], kind[keep], key[keep]
    perm = np.argsort(key, kind="stable")
    return a[perm], b[perm], kind[perm]
