"""Graph work on edge arrays: topological levels, the cycle report and the priority order, each
equal to what :func:`compile._assemble` computes on records."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Levels:
    """Nodes grouped by their longest distance (in edges) from a source of the DAG.

    ``nodes`` lists the ordered nodes level after level (``node_start[L]`` where level L
    begins); ``edge_a``/``edge_b`` list the edges by the level of their head (``edge_start``).
    ``ok`` is False when some node lies on or behind a cycle (it has no level).
    """

    level: np.ndarray
    nodes: np.ndarray
    node_start: np.ndarray
    edge_a: np.ndarray
    edge_b: np.ndarray
    edge_start: np.ndarray
    ok: bool


def levels(n: int, a: np.ndarray, b: np.ndarray) -> Levels:
    """Kahn's algorithm a whole frontier at a time."""
    indeg = np.bincount(b, minlength=n)
    level = np.full(n, -1, dtype=np.int64)
    perm = np.argsort(a, kind="stable")
    bs = b[perm]
    deg = np.bincount(a, minlength=n)
    first = np.concatenate([[0], np.cumsum(deg)])
    frontier = np.flatnonzero(indeg == 0)
    lv = 0
    while frontier.size:
        level[frontier] = lv
        cnt = deg[frontier]
        total = int(cnt.sum())
        if not total:
            break
        offs = np.repeat(first[frontier] - np.concatenate([[0], np.cumsum(cnt)[:-1]]), cnt)
        heads = bs[offs + np.arange(total)]
        indeg -= np.bincount(heads, minlength=n)
        heads = np.unique(heads)
        frontier = heads[indeg[heads] == 0]
        lv += 1
    ok = bool((level >= 0).all())
    nodes = np.argsort(level, kind="stable")
    lv_sorted = level[nodes]
    top = int(lv_sorted[-1]) + 1 if n else 0
    node_start = np.searchsorted(lv_sorted, np.arange(top + 1))
    hb = level[b]
    ep = np.argsort(hb, kind="stable")
    edge_start = np.searchsorted(hb[ep], np.arange(top + 1))
    return Levels(level, nodes, node_start, a[ep], b[ep], edge_start, ok)


def longest_path(lv: Levels, durations: np.ndarray) -> float:
    """Largest finish time, every node starting when its predecessors have finished."""
    n = durations.size
    if not n:
        return 0.0
    start = np.zeros(n)
    finish = np.zeros(n)
    ns, es = lv.node_start, lv.edge_start
    for k in range(ns.size - 1):
        e0, e1 = es[k], es[k + 1]
        if e1 > e0:
            np.maximum.at(start, lv.edge_b[e0:e1], finish[lv.edge_a[e0:e1]])
        nodes = lv.nodes[ns[k]:ns[k + 1]]
        finish[nodes] = start[nodes] + durations[nodes]
    return float(finish.max())


def cycle_names(n: int, a: np.ndarray, b: np.ndarray, level: np.ndarray,
                stage_of: Sequence[str]) -> list[str]:
    """:func:`compile._cycle_names` over the nodes without a level."""
    left = set(range(n)) - set(np.flatnonzero(level >= 0).tolist())
    it = np.fromiter(left, dtype=np.int64, count=len(left))
    rank = np.full(n, -1, dtype=np.int64)
    rank[it] = np.arange(it.size)
    inside = (rank[a] >= 0) & (rank[b] >= 0)
    ea, eb = a[inside], b[inside]
    perm = np.lexsort((rank[ea], eb))  # per head, its tail met first while iterating ``left``
    eb_s, ea_s = eb[perm], ea[perm]
    firsts = np.concatenate([[True], eb_s[1:] != eb_s[:-1]]) if eb_s.size else eb_s.astype(bool)
    pred = dict(zip(eb_s[firsts].tolist(), ea_s[firsts].tolist(), strict=True))
    seen: dict[int, int] = {}
    path: list[int] = []
    i = min(left)
    while i not in seen:
        seen[i] = len(path)
        path.append(i)
        i = pred[i]
    out: list[str] = []
    for j in path[seen[i]:][::-1]:
        if not out or out[-1] != stage_of[j]:
            out.append(stage_of[j])
    return out


def priority_order(n: int, edges: Sequence[tuple[int, int, str]],
                   keys: Sequence[tuple[int, int, str, int]]) -> list[int]:
    """The heap order of :func:`compile._assemble`: the ready primitive with the smallest key."""
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for x, y, _ in edges:
        succ[x].append(y)
        indeg[y] += 1
    heap = [keys[i] for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        i = heapq.heappop(heap)[3]
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, keys[j])
    return order
