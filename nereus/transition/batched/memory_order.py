"""The memory batches of :mod:`memory_order` on a batched DAG: the same "memory" edges and the
same check, computed on arrays for every GPU at once.

What :func:`memory_order.memory_batches` reads off records comes from the blocks here: per
(primitive, GPU it keeps busy) the bytes its inputs hold there, its peak there and the change it
leaves there (:func:`_incidences`). The GPUs' sequences are one sort of those rows by (GPU,
level, primitive); the greedy cut into batches finds every GPU's next batch end with one search
over the running sum of added bytes; each batch's edges are the rows of a contiguous range
before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from nereus.emu.primitives import shard_bytes
from nereus.errors import TransitionError
from nereus.transition.batched.assemble import BatchedDag
from nereus.transition.batched.blocks import (
    CONTIGUOUS,
    DESTROY,
    EXTEND,
    INTERLEAVED,
    MERGE,
    SPLIT,
    Block,
)
from nereus.transition.batched.memory import merge_received
from nereus.transition.graph import levels


def _incidences(blocks: Sequence[tuple[int, Block, int, int]], bad: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per (primitive, GPU of ``bad`` it keeps busy): the primitive, the GPU, the most bytes it
    may add there while it runs or once it is done (its peak over its inputs, or the change it
    leaves, at least 0) and the change it leaves there."""
    prims: list[np.ndarray] = []
    gpus: list[np.ndarray] = []
    ups: list[np.ndarray] = []
    lefts: list[np.ndarray] = []

    def add(first: int, rows: np.ndarray, up: int | np.ndarray, left: int) -> None:
        sel = bad[rows]
        r = sel.nonzero()[0]
        if not r.size:
            return
        prims.append(r + first)
        gpus.append(rows[sel])
        ups.append(np.full(r.size, up, dtype=np.int64) if isinstance(up, int) else up[sel])
        lefts.append(np.full(r.size, left, dtype=np.int64))

    for off, blk, sb, rep in blocks:
        first = off + blk.start
        own = shard_bytes(sb, blk.lay, rep)
        if blk.kind == DESTROY:  # inputs own, peak own, leaves -own
            add(first, blk.rows, 0, -own)
        elif blk.kind == EXTEND:
            assert blk.new is not None
            add(first, blk.rows, own, 0)  # the sender: inputs own, peak 2 own, leaves 0
            add(first, blk.new, own, own)  # the receiver: inputs 0, peak own, leaves own
        elif blk.kind == SPLIT:  # inputs own, peak own + part, leaves part - own
            assert blk.sub is not None
            part = shard_bytes(sb, blk.sub, rep)
            add(first, blk.rows, part, part - own)
        else:  # inputs part, peak part + received, leaves own - part
            assert blk.sub is not None and blk.grouping is not None
            assert blk.kind == MERGE
            part = shard_bytes(sb, blk.sub, rep)
            recv = np.empty(blk.rows.shape, dtype=np.int64)
            for g in (INTERLEAVED, CONTIGUOUS):
                sel = blk.grouping == g
                if np.count_nonzero(sel):
                    recv[sel] = merge_received(blk, sb, rep, g)
            add(first, blk.rows, np.maximum(recv, max(own - part, 0)), own - part)
    if not prims:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z, z
    return np.concatenate(prims), np.concatenate(gpus), np.concatenate(ups), \
        np.concatenate(lefts)


def order_memory_batches(b: BatchedDag, bad: Sequence[int], capacity: int,
                         held: Sequence[tuple[int, np.ndarray, int]]) -> BatchedDag | None:
    """``b`` with the "memory" edges of :func:`memory_order.memory_batches` on the GPUs ``bad``
    (their primitives in batches, by level); None where one primitive alone does not fit after
    the batches before it (the reference compiler then orders phases instead). ``held``:
    (model-stage number, rows, bytes per position) of the source units."""
    topo = b.topo
    assert topo.level is not None
    size = b.stages[0].release.size
    mask = np.zeros(size, dtype=bool)
    mask[np.asarray(bad, dtype=np.int64)] = True
    prim, gpu, up, left = _incidences(b.blocks, mask)
    if not prim.size:
        return b  # nothing runs there: nothing to order
    start = np.zeros(size, dtype=np.int64)
    for _, rows, nbytes in held:  # a model-stage's units hold distinct GPUs
        start[rows[mask[rows]]] += nbytes
    perm = np.lexsort((prim, topo.level[prim], gpu))
    prim, gpu, up, left = prim[perm], gpu[perm], up[perm], left[perm]
    n_rows = prim.size
    first = np.ones(n_rows, dtype=bool)
    first[1:] = gpu[1:] != gpu[:-1]
    heads = np.flatnonzero(first)
    # the greedy batches of every chained GPU at once, one batch at a time: a batch is the
    # longest run from its first row whose added bytes fit (``up`` >= 0, so its running sum
    # over all rows is sorted and one search finds every GPU's batch end)
    ends = np.append(heads[1:], n_rows)
    added = np.cumsum(up)
    leaves = np.cumsum(left)
    new_batch = first.copy()
    now = start[gpu[heads]]
    at, end = heads, ends
    while at.size:
        stop = np.searchsorted(added, capacity - now + added[at] - up[at], side="right")
        np.minimum(stop, end, out=stop)
        if np.count_nonzero(stop <= at):
            return None  # one primitive alone does not fit after the batches before it
        now += leaves[stop - 1] - leaves[at] + left[at]
        more = stop < end
        at, end, now = stop[more], end[more], now[more]
        new_batch[at] = True
    # batches numbered across GPUs; each waiting row follows every row from the last batch
    # before its own that holds a waiting row (or from its GPU's first batch) to its own
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
    key = np.sort(prim[x] * n + prim[y])
    if key.size:
        keep = np.empty(key.size, dtype=bool)
        keep[0] = True
        np.not_equal(key[1:], key[:-1], out=keep[1:])
        key = key[keep]
    ea, eb = key // n, key % n
    new = levels(n, np.concatenate([topo.a, ea]), np.concatenate([topo.b, eb]), topo.level)
    if not new.ok:  # pragma: no cover - the batches follow one topological order
        raise TransitionError("memory batches made a cycle")
    return replace(b, extra_a=ea, extra_b=eb, topo=new)
