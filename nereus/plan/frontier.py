"""The latency–GPU–memory Pareto frontier of a model-stage's costed candidates (DESIGN.md §3).

A candidate is dominated when another is no slower, needs no more GPUs in no larger placement
blocks, and holds no more persistent and no more peak bytes per GPU (``dominates``); ties keep
the smallest key. ``frontier`` is the plain reference over ``Costed`` records; ``frontier_indices``
computes the same set over arrays, which the plan search uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from nereus.plan.candidates import Costed


def _segment_prune(group: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Mask of rows (given in frontier order) that no earlier row of the same group beats:
    ``value`` strictly below the running minimum of the earlier rows of its group."""
    n = len(group)
    # dense ranks keep the combined key small: later groups are offset below earlier ones
    vrank = np.unique(value, return_inverse=True)[1].astype(np.int64)
    grank = np.unique(group, return_inverse=True)[1].astype(np.int64)
    by_group = np.argsort(grank, kind="stable")  # rows of a group stay in frontier order
    g_sorted = grank[by_group]
    key = vrank[by_group] + (int(g_sorted.max()) + 1 - g_sorted) * (n + 1)
    run = np.minimum.accumulate(key)
    prev = np.empty_like(run)
    prev[0] = np.iinfo(np.int64).max
    prev[1:] = run[:-1]
    start = np.ones(n, dtype=bool)
    start[1:] = g_sorted[1:] != g_sorted[:-1]
    keep_sorted = start | (key < prev)
    keep = np.empty(n, dtype=bool)
    keep[by_group] = keep_sorted
    return keep


FRONTIER_CHUNK = 256


def frontier_indices(
    lat: np.ndarray, g: np.ndarray, blk: np.ndarray, per: np.ndarray, pk: np.ndarray
) -> np.ndarray:
    """Indices of the Pareto frontier of candidates given by their latency, GPUs, block,
    persistent and peak bytes (see :func:`frontier`), in frontier order. The rows must be in key
    order (``Costed.key``): the row index breaks the ties of the five criteria.

    A row is dominated iff some row earlier in the order (latency, GPUs, block, persistent, peak,
    key) is no worse in all five criteria; dominance is transitive, so earlier rows need not be
    kept ones. Rows that share (GPUs, block, persistent) are first pruned on peak alone (a
    running minimum). The rest are cut into chunks (at most ``FRONTIER_CHUNK`` rows) in order:
    a row is checked pairwise against the earlier rows of its chunk and, for the rows of earlier
    chunks, against ``M[c, k]``, the smallest peak of an earlier chunk's row of class ``c`` =
    (block, persistent) with GPU-count rank ≤ k (prefix minima over GPU ranks and chunks), over
    the classes no larger than its own. Every chunk at once: a fixed number of array operations.
    """
    n = len(lat)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((np.arange(n), pk, per, blk, g, lat))
    per_rank = np.unique(per, return_inverse=True)[1].reshape(-1).astype(np.int64)
    grp = ((g * 1024 + blk) * (n + 1) + per_rank)[order]
    order = order[_segment_prune(grp, pk[order])]
    L, G, B, P, T = lat[order], g[order], blk[order], per[order], pk[order]
    if len(order) == 1:
        return order
    m = len(order)
    class_keys, cls = np.unique(B * (n + 1) + per_rank[order], return_inverse=True)
    cls = cls.reshape(-1)
    cb_of = np.zeros(len(class_keys), dtype=np.int64)
    cp_of = np.zeros(len(class_keys), dtype=np.int64)
    cb_of[cls] = B
    cp_of[cls] = P
    le = (cb_of[None, :] <= cb_of[:, None]) & (cp_of[None, :] <= cp_of[:, None])
    _, rank = np.unique(G, return_inverse=True)
    rank = rank.reshape(-1)
    big = np.iinfo(np.int64).max
    n_cls, n_rank = len(class_keys), int(rank.max()) + 1
    # chunk size balancing the pairwise check (chunk²) against the tables (classes × ranks)
    chunk = int(min(FRONTIER_CHUNK, max(16, (n_cls * n_rank) ** 0.5)))
    n_chunks = -(-m // chunk)
    part = np.arange(m) // chunk
    # M[k, c, r]: the smallest peak of a row of chunk k, class c, GPU rank <= r; accumulated over
    # chunks, the table each chunk is checked against is that of the chunks before it
    table = np.full((n_chunks + 1, n_cls, n_rank), big, dtype=np.int64)
    np.minimum.at(table, (part + 1, cls, rank), T)
    np.minimum.accumulate(table, axis=2, out=table)
    np.minimum.accumulate(table, axis=0, out=table)
    earlier = table[part, :, rank]  # (rows, classes): the chunks before each row's, best peaks
    dominated = ((earlier <= T[:, None]) & le[cls]).any(axis=1)
    # within a chunk: every earlier row of the chunk, pairwise (rows padded to whole chunks)
    pad = n_chunks * chunk - m
    idx = np.concatenate([np.arange(m), np.full(pad, m - 1)]).reshape(n_chunks, chunk)
    valid = (np.arange(n_chunks * chunk) < m).reshape(n_chunks, chunk)
    Lc, Gc, Tc, Cc = L[idx], G[idx], T[idx], cls[idx]
    tri = np.tri(chunk, chunk, -1, dtype=bool)  # [i, j]: j before i
    pair = (le[Cc[:, :, None], Cc[:, None, :]] & (Lc[:, None, :] <= Lc[:, :, None])
            & (Gc[:, None, :] <= Gc[:, :, None]) & (Tc[:, None, :] <= Tc[:, :, None])
            & tri[None] & valid[:, None, :])
    dominated |= pair.any(axis=2).reshape(-1)[:m]
    return order[~dominated]


def dominates(a: Costed, b: Costed) -> bool:
    """``a`` is no worse than ``b`` in every frontier criterion."""
    return (
        a.latency_s <= b.latency_s
        and a.persistent_bytes <= b.persistent_bytes
        and a.peak_bytes <= b.peak_bytes
        and a.num_gpus <= b.num_gpus
        and a.block <= b.block
    )


def frontier(costed: Sequence[Costed]) -> tuple[Costed, ...]:
    """Pareto frontier over (latency, GPUs, block, persistent, peak); ties keep the smallest key.

    Sorted by all criteria: a point can only be dominated by an earlier one.
    """
    order = sorted(
        costed,
        key=lambda c: (c.latency_s, c.num_gpus, c.block, c.persistent_bytes, c.peak_bytes, c.key),
    )
    kept: list[Costed] = []
    # Bucket kept points by (GPUs, block): few distinct pairs, so the check is short.
    buckets: dict[tuple[int, int], list[Costed]] = {}
    for c in order:
        dominated = False
        for (g, blk), pts in buckets.items():
            if g <= c.num_gpus and blk <= c.block:
                for k in pts:
                    if k.persistent_bytes <= c.persistent_bytes and k.peak_bytes <= c.peak_bytes:
                        dominated = True
                        break
                if dominated:
                    break
        if not dominated:
            kept.append(c)
            buckets.setdefault((c.num_gpus, c.block), []).append(c)
    return tuple(kept)
