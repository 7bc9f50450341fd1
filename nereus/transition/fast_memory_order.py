"""The memory batches of :mod:`memory_order` on a batched DAG: the same "memory" edges and the
same check, computed on arrays for every GPU at once.

What :func:`memory_order.memory_batches` reads off records comes from the blocks here: per
(primitive, GPU it keeps busy) the bytes its inputs hold there, its peak there and the change it
leaves there (:func:`_incidences`). The GPUs' sequences are one sort of those rows by (GPU,
level, primitive); the greedy cut into batches runs one position of the sequences at a time
across all GPUs; each batch's edges are the rows of a contiguous range before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from nereus.errors import TransitionError
from nereus.transition.fast_assemble import BatchedDag
from nereus.transition.fast_blocks import (
    CONTIGUOUS,
    DESTROY,
    EXTEND,
    INTERLEAVED,
    MERGE,
    SPLIT,
    Block,
)
from nereus.transition.fast_graph import levels
from nereus.transition.fast_memory import _received
from nereus.transition.primitives import shard_bytes


def _incidences(blocks: Sequence[tuple[int, Block, int, int]], stage_of_block: Sequence[int],
                bad: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per (primitive, GPU of ``bad`` it keeps busy): primitive, GPU, model-stage number, and
    the bytes its inputs hold there, its peak there and the change it leaves there."""
    parts: list[tuple[np.ndarray, ...]] = []

    def add(i: np.ndarray, rows: np.ndarray, k: int, inputs: int | np.ndarray,
            peak: int | np.ndarray, delta: int | np.ndarray) -> None:
        sel = bad[rows]
        if not np.count_nonzero(sel):
            return
        shape = rows.shape
        parts.append((np.broadcast_to(i[:, None], shape)[sel], rows[sel],
                      np.full(int(np.count_nonzero(sel)), k, dtype=np.int64),
                      np.broadcast_to(inputs, shape)[sel], np.broadcast_to(peak, shape)[sel],
                      np.broadcast_to(delta, shape)[sel]))

    for (off, blk, sb, rep), k in zip(blocks, stage_of_block, strict=True):
        i = off + blk.start + np.arange(blk.rows.shape[0])
        own = shard_bytes(sb, blk.lay, rep)
        if blk.kind == DESTROY:
            add(i, blk.rows, k, own, own, -own)
        elif blk.kind == EXTEND:
            assert blk.new is not None
            add(i, blk.rows, k, own, 2 * own, 0)
            add(i, blk.new, k, 0, own, own)
        elif blk.kind == SPLIT:
            assert blk.sub is not None
            part = shard_bytes(sb, blk.sub, rep)
            add(i, blk.rows, k, own, own + part, part - own)
        else:
            assert blk.sub is not None and blk.grouping is not None
            assert blk.kind == MERGE
            part = shard_bytes(sb, blk.sub, rep)
            recv = np.empty(blk.rows.shape, dtype=np.int64)
            for g in (INTERLEAVED, CONTIGUOUS):
                sel = blk.grouping == g
                if np.count_nonzero(sel):
                    recv[sel] = _received(blk.lay.tp, blk.lay.pp, blk.sub.tp, blk.sub.pp, g,
                                          sb, rep)
            add(i, blk.rows, k, part, part + recv, own - part)
    if not parts:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z, z, z, z
    return tuple(np.concatenate([p[c] for p in parts]) for c in range(6))


def order_memory_batches(b: BatchedDag, bad: Sequence[int], capacity: int,
                 held: Sequence[tuple[int, np.ndarray, int]]) -> BatchedDag | None:
    """``b`` with the "memory" edges of :func:`memory_order.memory_batches` on the GPUs ``bad`` (their
    primitives in batches, by level); None where one primitive alone does not fit after the
    batches before it (the reference compiler then orders phases instead). ``held``:
    (model-stage number, rows, bytes per position) of the source units."""
    topo = b.topo
    assert topo.level is not None
    size = b.stages[0].release.size
    mask = np.zeros(size, dtype=bool)
    mask[np.asarray(bad, dtype=np.int64)] = True
    stage_of_block = [k for k, loc in enumerate(b.stages) for _ in loc.blocks]
    prim, gpu, _, inputs, peak, left = _incidences(b.blocks, stage_of_block, mask)
    start = np.zeros(size, dtype=np.int64)
    for _, rows, nbytes in held:
        np.add.at(start, rows[mask[rows]], nbytes)
    perm = np.lexsort((prim, topo.level[prim], gpu))
    prim, gpu, left = prim[perm], gpu[perm], left[perm]
    up = np.maximum(np.maximum(peak[perm] - inputs[perm], left), 0)
    n_rows = prim.size
    first = np.ones(n_rows, dtype=bool)
    first[1:] = gpu[1:] != gpu[:-1]
    heads = np.flatnonzero(first)
    length = np.diff(np.append(heads, n_rows))
    # the greedy batches of every chained GPU at once, one position of the chains at a time
    now = start[gpu[heads]]
    grow = np.zeros(heads.size, dtype=np.int64)
    change = np.zeros(heads.size, dtype=np.int64)
    batch = np.zeros(heads.size, dtype=np.int64)
    bid = np.empty(n_rows, dtype=np.int64)
    seg = np.arange(heads.size)
    for j in range(int(length.max(initial=0))):
        if j:
            seg = seg[length[seg] > j]
        r = heads[seg] + j
        u = up[r]
        if j:
            close = seg[now[seg] + grow[seg] + u > capacity]
            now[close] += change[close]
            grow[close] = 0
            change[close] = 0
            batch[close] += 1
        if np.count_nonzero(now[seg] + u > capacity):
            return None
        grow[seg] += u
        change[seg] += left[r]
        bid[r] = batch[seg]
    # batches numbered across GPUs; each waiting row follows every row from the last batch
    # before its own that holds a waiting row (or from its GPU's first batch) to its own
    new_batch = first.copy()
    new_batch[1:] |= bid[1:] != bid[:-1]
    gb = np.cumsum(new_batch) - 1
    starts = np.flatnonzero(new_batch)
    waits = up > 0
    has = np.zeros(starts.size, dtype=bool)
    has[gb[waits]] = True
    first_of_gpu = np.maximum.accumulate(np.where(first[starts], np.arange(starts.size), 0))
    last = np.maximum.accumulate(np.where(has, np.arange(starts.size), -1))
    before = np.empty(starts.size, dtype=np.int64)
    before[0] = -1
    before[1:] = last[:-1]
    lo = starts[np.maximum(before, first_of_gpu)]
    y = np.flatnonzero(waits)
    x_lo, x_hi = lo[gb[y]], starts[gb[y]]
    count = x_hi - x_lo
    y = y.repeat(count)
    offs = np.cumsum(count) - count
    x = x_lo.repeat(count) + np.arange(int(count.sum())) - offs.repeat(count)
    n = b.n
    key = np.unique(prim[x] * n + prim[y])
    ea, eb = key // n, key % n
    new = levels(n, np.concatenate([topo.a, ea]), np.concatenate([topo.b, eb]))
    if not new.ok:  # pragma: no cover - the batches follow one topological order
        raise TransitionError("memory chains made a cycle")
    extra = tuple(zip(ea.tolist(), eb.tolist(), ("memory",) * ea.size, strict=True))
    return replace(b, extra=extra, topo=new)
