"""Graph work on edge arrays: topological levels, the cycle report and the priority order, each
equal to what :func:`compile._assemble` computes on records."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Levels:
    """Acyclicity and depth of a DAG given as edge arrays ``a → b``.

    ``depth`` is the most edges on any path; ``level`` per node the most edges on a path ending
    there. ``ok`` False: some node lies on or behind a cycle; ``level`` then holds Kahn's levels
    with -1 for the nodes it could not order.
    """

    a: np.ndarray
    b: np.ndarray
    depth: int
    ok: bool
    level: np.ndarray | None = None


MAX_RELAX = 64  # deeper DAGs (or cycles) go to Kahn's algorithm


def levels(n: int, a: np.ndarray, b: np.ndarray) -> Levels:
    """Longest path (in edges) ending at each node by relaxing every edge at once until
    nothing changes — depth + 1 rounds on a DAG, the edges out of nodes without predecessors
    only in the first — and Kahn's algorithm where that does not settle (a cycle, or a DAG
    deeper than :data:`MAX_RELAX`)."""
    lv = np.zeros(n, dtype=np.int64)
    if not a.size:
        return Levels(a, b, 0, True, lv)
    # edges out of nodes without predecessors give their heads level 1 once and for all
    root = np.bincount(b, minlength=n)[a] == 0
    lv[b[root]] = 1
    keep = ~root
    ra, rb = a[keep], b[keep]
    total = int(np.add.reduce(lv))
    grew = [-1, -2]  # the last two rounds' growth of the level sum
    for _ in range(MAX_RELAX):
        x = lv[ra]
        x += 1
        np.maximum.at(lv, rb, x)
        now = int(np.add.reduce(lv))
        if now == total:
            return Levels(a, b, int(np.maximum.reduce(lv)), True, lv)
        # on a DAG a round raises only nodes at least that deep, fewer and fewer; the same
        # growth three rounds running is what a cycle does (nodes on or behind it rise by one
        # each round): Kahn's algorithm decides at once (the same levels if there is none)
        if now - total == grew[0] == grew[1]:
            break
        grew = [now - total, grew[0]]
        total = now
    level = kahn_levels(n, a, b)
    ok = bool((level >= 0).all())
    return Levels(a, b, int(level.max()) if ok else -1, ok, level)


def kahn_levels(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Kahn's algorithm a whole frontier at a time: each node's level, -1 for nodes on or
    behind a cycle."""
    indeg = np.bincount(b, minlength=n)
    level = np.full(n, -1, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    lv = 0
    while frontier.size:
        level[frontier] = lv
        inside = np.zeros(n, dtype=bool)
        inside[frontier] = True
        dec = np.bincount(b[inside[a]], minlength=n)
        indeg -= dec
        frontier = np.flatnonzero((dec > 0) & (indeg == 0))
        lv += 1
    return level


def longest_path(lv: Levels, durations: np.ndarray) -> float:
    """Largest finish time, every node starting when its predecessors have finished: finish =
    duration + the latest predecessor's finish, a level at a time (the edges into the nodes of
    one level read finished predecessors only, so each edge is relaxed once)."""
    if not durations.size:
        return 0.0
    finish = durations.copy()
    if not lv.depth:
        return float(finish.max())
    assert lv.level is not None
    head = lv.level[lv.b]
    by = np.argsort(head, kind="stable")
    ea, eb = lv.a[by], lv.b[by]
    ends = np.bincount(head, minlength=lv.depth + 1).cumsum().tolist()
    start = np.zeros(durations.size)
    for d in range(1, lv.depth + 1):
        lo, hi = ends[d - 1], ends[d]
        np.maximum.at(start, eb[lo:hi], finish[ea[lo:hi]])
        np.add(start, durations, out=finish)
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
