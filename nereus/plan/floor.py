"""A memory-aware lower bound of a lane's step latency, for pools of whole nodes (pure, numpy).

The DP (:mod:`nereus.plan.dp`) searches within ``U = (1 + slack) · floor`` and drops every
option slower than that; the tighter the floor, the fewer options it keeps. Its first floor
ignores co-residency (the relaxed minimum of each phase alone), which at thousands of GPUs can
sit several percent below the optimum — far enough that the DP then combines thousands of
frontier points per model-stage (minutes at 4,096 GPUs). This floor keeps the memory bound.

For one lane on a pool of whole nodes (the GPU count is the one budget): a plan's memory bound
is ``Σ_φ P_φ + max_φ (PT_φ − P_φ) ≤ capacity`` with ``P_φ``/``PT_φ`` the largest persistent and
peak bytes per GPU of phase φ's candidates; the bound grows with every ``P_φ`` and ``PT_φ``.
So for caps ``(P_c, PT_c)`` per phase, the fastest phase latency using only candidates within
them — the phase's GPU split solved exactly: the smallest latency ``L`` at which the model-
stages' fewest GPUs within ``L`` add up to at most the pool — summed over phases, minimized over
caps that meet the bound, is the lane's optimum (the optimum's own maxima are among the caps,
and every cap's phase solutions are real plans). Lanes share the pool, so for several lanes it
is a lower bound per lane. Deterministic: numpy over sorted arrays, no clock.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# (latency_s, demand, persistent, peak, picks) as in nereus.plan.dp
Point = tuple[float, tuple[int, ...], int, int, tuple[int, ...]]
Level = tuple[float, int, int]  # (fastest phase latency, P cap, PT cap)


def _stage_arrays(pts: Sequence[Point], cap: int) -> tuple[np.ndarray, ...]:
    """Latency, GPUs, persistent and peak of the points that fit ``cap`` GPUs, by latency."""
    rows = [(p[0], p[1][0], p[2], p[3]) for p in pts if p[1][0] <= cap]
    if not rows:
        return (np.zeros(0),) * 4
    a = np.array(rows, dtype=np.float64)
    order = np.argsort(a[:, 0], kind="stable")
    a = a[order]
    return a[:, 0], a[:, 1], a[:, 2], a[:, 3]


def phase_levels(stage_pts: Sequence[Sequence[Point]], cap: int) -> list[Level]:
    """Per memory caps ``(P_c, PT_c)`` (the phase's own persistent and peak values), the fastest
    latency of the phase with every model-stage within them and all of them on ``cap`` GPUs;
    only the Pareto-minimal levels (no other is as fast with caps as small)."""
    stages = [_stage_arrays(p, cap) for p in stage_pts]
    if any(len(s[0]) == 0 for s in stages):
        return []
    p_vals = np.unique(np.concatenate([s[2] for s in stages]))
    grid = np.unique(np.concatenate([s[0] for s in stages]))  # every latency a phase can take
    # each model-stage's last point within grid[k], for every k
    at = [np.searchsorted(s[0], grid, side="right") - 1 for s in stages]
    levels: list[Level] = []
    for pc in p_vals.tolist():
        # the stages' points within pc; PT caps: their peaks at or above pc (a PT cap below
        # pc admits only smaller P, another level; caps between peaks admit the same points)
        keep = [np.flatnonzero(per <= pc) for _, _, per, _ in stages]
        if any(len(k) == 0 for k in keep):
            continue
        pts_c = np.unique(np.concatenate([s[3][k] for s, k in zip(stages, keep, strict=True)]))
        pts_c = pts_c[pts_c >= pc]
        if len(pts_c) == 0:
            continue
        # per model-stage, under every PT cap: the fewest GPUs among its kept points up to
        # each one (by latency), and which kept point is the last within every grid latency
        best, pos = [], []
        for (_, gpus, _, peak), k, a in zip(stages, keep, at, strict=True):
            table = np.full((len(pts_c), len(k)), np.inf)
            rank = np.searchsorted(pts_c, peak[k])
            inside = rank < len(pts_c)
            table[rank[inside], np.flatnonzero(inside)] = gpus[k[inside]]
            np.minimum.accumulate(table, axis=0, out=table)
            best.append(np.minimum.accumulate(table, axis=1, out=table))
            pos.append(np.searchsorted(k, a, side="right") - 1)
        rows = np.arange(len(pts_c))

        def total(g: np.ndarray, best: list[np.ndarray] = best, pos: list[np.ndarray] = pos,
                  rows: np.ndarray = rows) -> np.ndarray:
            out = np.zeros(len(rows))
            for b, p in zip(best, pos, strict=True):
                i = p[g]
                out += np.where(i >= 0, b[rows, np.maximum(i, 0)], np.inf)
            return out

        # the first grid index where the model-stages' fewest GPUs fit (non-increasing in g)
        lo, hi = np.zeros(len(rows), dtype=np.int64), np.full(len(rows), len(grid) - 1)
        ok_end = total(hi) <= cap
        while True:
            open_ = lo < hi
            if not open_.any():
                break
            mid = (lo + hi) // 2
            fits = total(mid) <= cap
            hi = np.where(open_ & fits, mid, hi)
            lo = np.where(open_ & ~fits, mid + 1, lo)
        for j in np.flatnonzero(ok_end).tolist():
            levels.append((float(grid[lo[j]]), int(pc), int(pts_c[j])))
    return minimal_levels(levels)


def minimal_levels(levels: list[Level]) -> list[Level]:
    """Levels no other is at least as good in all of (latency, P cap, PT cap): by latency, each
    kept unless an earlier one has both caps as small (a staircase over P with PT falling)."""
    levels.sort()
    out: list[Level] = []
    ps: list[int] = []  # the staircase: P ascending, its PT strictly descending
    pts: list[int] = []
    for lv in levels:
        _, p, pt = lv
        i = bisect_right(ps, p) - 1
        if i >= 0 and pts[i] <= pt:
            continue
        out.append(lv)
        j = i + 1
        while j < len(ps) and pts[j] >= pt:
            j += 1
        ps[i + 1:j] = [p]
        pts[i + 1:j] = [pt]
    return out


def _states(levels_by_phase: Sequence[Sequence[Level]], capacity: int) -> list[Level]:
    """Pareto-minimal ``(Σ latency, Σ P, max (PT − P))`` over one level per phase, each within
    the memory bound."""
    states: list[Level] = [(0.0, 0, 0)]
    for levels in levels_by_phase:
        new: list[Level] = []
        for lat, ps, ex in states:
            for l2, p2, pt2 in levels:
                np_, ne = ps + p2, max(ex, pt2 - p2)
                if np_ + ne <= capacity:
                    new.append((lat + l2, np_, ne))
        states = minimal_levels(new)
        if not states:
            return []
    return states


@dataclass(frozen=True)
class LaneBounds:
    """What :func:`lane_bounds` knows of one lane: its optimum ``floor_s``; per phase its
    fastest latency whatever the memory (``phase_min_s``); per phase, model-stage and DP point
    ``need_s``: the point's latency plus the fewest seconds the lane's other phases take beside
    a phase holding that point's persistent and peak bytes — no plan faster than ``U`` uses a
    point whose ``need_s`` exceeds ``U``."""

    floor_s: float
    phase_min_s: tuple[float, ...]
    need_s: tuple[tuple[tuple[float, ...], ...], ...]


def lane_bounds(phases: Sequence[Sequence[Sequence[Point]]], cap: int, capacity: int
                ) -> LaneBounds:
    """The bounds of one lane on ``cap`` GPUs of whole nodes (:class:`LaneBounds`; ``inf``
    where nothing fits): each phase at memory caps, the caps meeting
    ``Σ P_c + max (PT_c − P_c) ≤ capacity``; the other phases' fewest seconds beside a phase
    at ``(P, PT)`` are monotone in both, so a point's own bytes bound its phase's from below."""
    levels = [phase_levels(stage_pts, cap) for stage_pts in phases]
    inf = float("inf")
    if any(not lv for lv in levels):
        return LaneBounds(inf, tuple(inf for _ in phases),
                          tuple(tuple(tuple(inf for _ in p) for p in sp) for sp in phases))
    states = _states(levels, capacity)
    floor = min((st[0] for st in states), default=inf)
    need = []
    for k, stage_pts in enumerate(phases):
        rest = _states([*levels[:k], *levels[k + 1:]], capacity)
        need.append(tuple(_need(p, rest, capacity) for p in stage_pts))
    return LaneBounds(floor, tuple(lv[0][0] for lv in levels), tuple(need))


def _need(pts: Sequence[Point], rest: Sequence[Level], capacity: int) -> tuple[float, ...]:
    """Per point: its latency plus the fastest of ``rest`` (other phases' states) that fits in
    memory beside it (``inf`` when none does)."""
    if not pts:
        return ()
    lat = np.array([p[0] for p in pts])
    if not rest:
        return tuple(np.full(len(pts), np.inf).tolist())
    per = np.array([p[2] for p in pts], dtype=np.float64)
    excess = np.array([p[3] for p in pts], dtype=np.float64) - per
    r = np.array(rest, dtype=np.float64)  # (Σ latency, Σ P, max excess), by latency
    bound = r[None, :, 1] + per[:, None] + np.maximum(r[None, :, 2], excess[:, None])
    ok = bound <= capacity
    first = np.where(ok.any(axis=1), ok.argmax(axis=1), -1)  # rest is sorted by latency
    out = np.where(first >= 0, lat + r[np.maximum(first, 0), 0], np.inf)
    return tuple(out.tolist())
