"""Graph work shared by both compilers: the stage-order tie-break (gen → inf → train), and on
edge arrays the topological levels, the cycle report and the priority order, each equal to what
the reference compiler (:mod:`nereus.transition.reference.compile`) computes on records."""

from __future__ import annotations

import heapq
from bisect import bisect_right
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


_STAGE_SUFFIX = {"gen": 0, "inf": 1, "train": 2}


def default_stage_rank(model_stage: str) -> int:
    """gen → inf → train from the model-stage name's suffix (``actor-gen`` → 0); others 1."""
    return _STAGE_SUFFIX.get(model_stage.rsplit("-", 1)[-1], 1)


MAX_RELAX = 64  # deeper DAGs (or cycles) go to Kahn's algorithm


def levels(n: int, a: np.ndarray, b: np.ndarray, start: np.ndarray | None = None) -> Levels:
    """Longest path (in edges) ending at each node by relaxing every edge at once until
    nothing changes — depth + 1 rounds on a DAG, the edges out of nodes without predecessors
    only in the first — and Kahn's algorithm where that does not settle (a cycle, or a DAG
    deeper than :data:`MAX_RELAX`). ``start``: levels no higher than the result (those of a
    DAG with a subset of these edges), relaxed from instead of zeros: only what the other
    edges raise takes rounds."""
    lv = np.zeros(n, dtype=np.int64) if start is None else start.copy()
    if not a.size:
        return Levels(a, b, 0, True, lv)
    # edges out of nodes without predecessors give their heads level 1 once and for all
    root = np.bincount(b, minlength=n)[a] == 0
    if start is None:
        lv[b[root]] = 1
    else:
        np.maximum.at(lv, b[root], 1)
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
                names: Sequence[str], offsets: Sequence[int]) -> list[str]:
    """:func:`compile._cycle_names` over the nodes without a level (node ``j`` belongs to
    ``names[k]`` for the last ``offsets[k] <= j``): walking back from the smallest of them,
    a node's predecessor is the first of its unordered tails in the iteration order of the
    set of unordered nodes, which is built only where a node on the walk has several."""
    out = level < 0
    inside = out[a] & out[b]
    ea, eb = a[inside], b[inside]
    by = np.argsort(eb, kind="stable")
    ea, eb = ea[by], eb[by]
    order_of: dict[int, int] | None = None
    seen: dict[int, int] = {}
    path: list[int] = []
    i = int(np.argmax(out))
    while i not in seen:  # every unordered node has an unordered predecessor: walk back
        seen[i] = len(path)
        path.append(i)
        lo, hi = np.searchsorted(eb, (i, i + 1)).tolist()
        tails = ea[lo:hi]
        pred = int(tails[0])
        if hi - lo > 1 and np.count_nonzero(tails != pred):
            if order_of is None:  # as the reference builds it
                left = set(range(n)) - set(np.flatnonzero(~out).tolist())
                order_of = {x: k for k, x in enumerate(left)}
            pred = min(set(tails.tolist()), key=order_of.__getitem__)
        i = pred
    names_out: list[str] = []
    for j in path[seen[i]:][::-1]:
        m = names[bisect_right(offsets, j) - 1]
        if not names_out or names_out[-1] != m:
            names_out.append(m)
    return names_out


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
