"""Dynamic programming over model-stages and phases (exact for ``nereus.plan.problem``).

Per phase, the frontier candidates of its model-stages are combined one model-stage at a time
into phase options ``(latency = max, demand = Σ, P = max persistent, PT = max peak)``, keeping the
Pareto set. Per lane, the phases are combined into states ``(Σ latency, demand = max, Σ P,
max (PT − P))``, keeping the Pareto set of states that can still meet the memory bound
``Σ P + max (PT − P) ≤ capacity``. Every operation is monotone in every kept dimension, so
dropping dominated options and states never loses the optimum. Lanes share the pool: all lanes
but the last enumerate their Pareto (latency, demand) solutions, the last is solved on what they
leave. Ties are broken by frontier indices, so the result is deterministic.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence

from nereus.plan.candidates import Costed, StageTable, demand_of
from nereus.plan.floor import lane_bounds
from nereus.plan.problem import Problem

# (latency_s, demand, x, y, picks): x, y are (P, PT) for options and (Σ P, max excess) for states.
Point = tuple[float, tuple[int, ...], int, int, tuple[int, ...]]


class _Front:
    """Points inserted in order of latency; keeps those no earlier point dominates."""

    __slots__ = ("buckets",)

    def __init__(self) -> None:
        self.buckets: dict[tuple[int, ...], tuple[list[int], list[int]]] = {}

    def add(self, d: tuple[int, ...], x: int, y: int) -> bool:
        n = len(d)
        for bd, (xs, ys) in self.buckets.items():
            if (
                n == 0
                or (bd[0] <= d[0] if n == 1 else all(a <= b for a, b in zip(bd, d, strict=True)))
            ):
                i = bisect_right(xs, x) - 1
                if i >= 0 and ys[i] <= y:
                    return False
        xs, ys = self.buckets.setdefault(d, ([], []))
        i = bisect_left(xs, x)
        j = i
        while j < len(xs) and ys[j] >= y:
            j += 1
        del xs[i:j]
        del ys[i:j]
        xs.insert(i, x)
        ys.insert(i, y)
        return True


def pareto(points: list[Point]) -> list[Point]:
    points.sort()
    front = _Front()
    return [p for p in points if front.add(p[1], p[2], p[3])]


def stage_points(table: StageTable, levels: tuple[int, ...], caps: tuple[int, ...]) -> Sequence[Point]:
    """DP points of the frontier candidates (front indices), by latency.

    On whole-node pools the table's points as they are (``phase_options`` cuts by GPUs); else
    only those that fit the pool, with their demand at its levels.
    """
    if len(levels) == 1:
        return table.points
    fr = table.front_rows
    pts: list[Point] = []
    for i in table.fitting(levels, caps).tolist():
        blk, g = int(fr.block[i]), int(fr.num_gpus[i])
        pts.append((table.points[i][0], demand_of(blk, g, levels), table.points[i][2],
                    table.points[i][3], (i,)))
    return pts


def _fits(d: tuple[int, ...], cap: tuple[int, ...]) -> bool:
    return all(a <= b for a, b in zip(d, cap, strict=True))


def phase_options(
    stage_pts: Sequence[Sequence[Point]], cap: tuple[int, ...], max_latency_s: float,
    need: Sequence[Sequence[float]],
) -> list[Point]:
    """Pareto options of one phase within ``cap`` whose plans can finish within
    ``max_latency_s``: ``need`` gives per model-stage and point a lower bound of the step
    latency of any plan using the point (its latency plus the other phases' floor, or
    :class:`nereus.plan.floor.LaneBounds`); points above the cap are left out."""
    zero = tuple(0 for _ in cap)
    multi = len(cap) > 1  # level 1 is checked by the ``room0`` cut alone otherwise
    within = [[p for p, v in zip(pts, nd, strict=True) if v <= max_latency_s]
              for pts, nd in zip(stage_pts, need, strict=True)]
    # The demand window: a model-stage's candidate can be combined only if the others' smallest
    # demands within the latency bound still fit beside it (at 16,384 GPUs this keeps a few
    # dozen of several thousand frontier points per model-stage near the bound).
    least = [min((p[1][0] for p in pts), default=cap[0] + 1) for pts in within]
    if sum(least) > cap[0]:
        return []
    partial: list[Point] = [(0.0, zero, 0, 0, ())]
    for i, pts in enumerate(within):
        room = cap[0] - (sum(least) - least[i])
        usable = sorted((p for p in pts if p[1][0] <= room), key=lambda p: p[1])
        new: list[Point] = []
        for lat, dem, p, pt, picks in partial:
            room0 = cap[0] - dem[0]
            for l2, d2, p2, pt2, i2 in usable:
                if d2[0] > room0:
                    break
                nd = tuple(a + b for a, b in zip(dem, d2, strict=True))
                if multi and not _fits(nd, cap):
                    continue
                new.append((max(lat, l2), nd, max(p, p2), max(pt, pt2), picks + i2))
        partial = pareto(new)
    return partial


def _fastest(pts: Sequence[Point], cap: tuple[int, ...]) -> list[tuple[float, tuple[int, ...]]]:
    """The fastest latency per demand vector among ``pts`` that fit ``cap``."""
    fastest: dict[tuple[int, ...], float] = {}
    for p in pts:
        if p[0] < fastest.get(p[1], float("inf")) and _fits(p[1], cap):
            fastest[p[1]] = p[0]
    return [(lat, d) for d, lat in fastest.items()]


def _relaxed_min(reduced: Sequence[list[tuple[float, tuple[int, ...]]]], cap: tuple[int, ...]) -> float:
    """Fastest phase latency within ``cap`` ignoring co-residency (a lower bound).

    The minimum over every combination (one option per model-stage within ``cap``) of the
    largest latency. On one level (whole-node pools) :func:`_relaxed_min_gpus` answers it by a
    search over the latencies; otherwise options are tried fastest first, so a branch stops at
    the first option no faster than the best found."""
    if len(cap) == 1:
        return _relaxed_min_gpus(reduced, cap[0])
    best = float("inf")
    if not reduced:
        return 0.0
    lists = [sorted(r) for r in reduced]

    def rec(k: int, lat: float, dem: tuple[int, ...]) -> None:
        nonlocal best
        if lat >= best:
            return
        if k == len(lists):
            best = lat
            return
        for l2, d2 in lists[k]:
            if l2 >= best:
                break  # sorted: every later option is slower still
            nd = tuple(a + b for a, b in zip(dem, d2, strict=True))
            if _fits(nd, cap):
                rec(k + 1, max(lat, l2), nd)

    rec(0, 0.0, tuple(0 for _ in cap))
    return best


def _relaxed_min_gpus(reduced: Sequence[list[tuple[float, tuple[int, ...]]]], cap: int) -> float:
    """:func:`_relaxed_min` on a pool of whole nodes: the smallest latency L at which the
    model-stages' fewest GPUs within L add up to at most ``cap`` (a search over the latencies,
    each model-stage's fewest GPUs a running minimum along its own latencies)."""
    if not reduced:
        return 0.0
    fewest: list[tuple[list[float], list[int]]] = []
    for opts in reduced:
        ordered = sorted((lat, d[0]) for lat, d in opts if d[0] <= cap)
        if not ordered:
            return float("inf")
        lats, gs, low = [], [], cap + 1
        for lat, g in ordered:
            low = min(low, g)
            lats.append(lat)
            gs.append(low)
        fewest.append((lats, gs))

    def fits(limit: float) -> bool:
        total = 0
        for lats, gs in fewest:
            i = bisect_right(lats, limit) - 1
            if i < 0:
                return False
            total += gs[i]
        return total <= cap

    grid = sorted({lat for lats, _ in fewest for lat in lats})
    lo, hi = 0, len(grid) - 1
    if not fits(grid[hi]):
        return float("inf")
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(grid[mid]):
            hi = mid
        else:
            lo = mid + 1
    return grid[lo]


def solve_lane(
    options: Sequence[list[Point]],
    cap: tuple[int, ...],
    capacity: int,
    keep_demand: bool,
    bounds: Sequence[float] = (),
    max_latency_s: float = float("inf"),
) -> list[Point]:
    """Pareto states of a whole lane (``keep_demand``) or its single best state (else).

    ``bounds[k]`` is a lower bound of the latency of phases k+1…; states that cannot finish
    within ``max_latency_s`` are dropped.
    """
    zero: tuple[int, ...] = tuple(0 for _ in cap) if keep_demand else ()
    states: list[Point] = [(0.0, zero, 0, 0, ())]
    for k, opts in enumerate(options):
        rest = bounds[k] if bounds else 0.0
        usable = [o for o in opts if _fits(o[1], cap)]
        if not keep_demand:  # the budget is checked: drop the demand and prune again
            usable = pareto([(o[0], (), o[2], o[3], o[4]) for o in usable])
        last = k == len(options) - 1
        new: list[Point] = []
        best: Point | None = None
        for lat, dem, ps, ex, picks in states:
            for l2, d2, p2, pt2, pk in usable:
                total = lat + l2
                if total + rest > max_latency_s:
                    continue
                np_ = ps + p2
                ne = max(ex, pt2 - p2)
                if np_ + ne > capacity:
                    continue
                nd = tuple(max(a, b) for a, b in zip(dem, d2, strict=True)) if keep_demand else ()
                pt = (total, nd, np_, ne, picks + pk)
                if last and not keep_demand:
                    if best is None or (pt[0], pt[4]) < (best[0], best[4]):
                        best = pt
                else:
                    new.append(pt)
        if last and not keep_demand:
            return [best] if best is not None else []
        states = pareto(new)
        if not states:
            return []
    return states


def _split_floor(
    lanes: Sequence[Sequence[Sequence[str]]],
    fast: dict[str, list[tuple[float, tuple[int, ...]]]],
    cap: tuple[int, ...],
) -> float:
    """Relaxed lower bound of a two-lane step: the lanes split the pool's GPUs.

    ``min over b of max(LB_0(b), LB_1(|pool| − b))`` with ``LB_l(b)`` the relaxed latency of lane
    l within b GPUs (level 1; other levels as in the pool, a relaxation). ``LB_0`` only changes at
    GPU counts some phase of lane 0 can use, so those are the b tried.
    """

    def lane_lb(lane: Sequence[Sequence[str]], budget: int) -> float:
        c = (budget, *cap[1:])
        return sum(_relaxed_min([fast[n] for n in phase], c) for phase in lane)

    sizes: set[int] = set()
    for phase in lanes[0]:
        sums = {0}
        for n in phase:
            sums = {a + d[0] for a in sums for _, d in fast[n] if a + d[0] <= cap[0]}
        sizes |= sums
    best = float("inf")
    for b in sorted(sizes):
        if b <= 0:
            continue
        got = max(lane_lb(lanes[0], b), lane_lb(lanes[1], cap[0] - b))
        best = min(best, got)
    return best


# Relative slack over the relaxed optimum tried in turn before the unbounded search.
ROUNDS = (1e-9, 0.02, 0.1, 0.5)
# Frontier points (all model-stages) from which a failed first round switches to the
# memory-aware bounds (nereus.plan.floor): they cost tens of ms of numpy on small spaces, where
# the wider rounds cost less; on thousands of GPUs they turn minutes into a second.
MEMORY_BOUND_POINTS = 2000


def solve(problem: Problem) -> dict[str, Costed] | None:
    """The optimal choice (name → candidate) under budgets and the memory bound, or None.

    Searched in rounds: with the relaxed lower bound LB of every phase (co-residency ignored;
    for two lanes also the best split of the pool between them) and a cap U = (1 + slack)·LB,
    options and states that cannot finish within U are dropped;
    a plan found within U is optimal (nothing within U was dropped). Otherwise the next slack,
    and finally no cap. On pools of whole nodes with a large space, a failed first round
    switches to the memory-aware bounds of :mod:`nereus.plan.floor` (the exact optimum of one
    lane, and per point a bound of any plan using it) and starts the rounds again from them.
    """
    wf = problem.workflow
    fronts = {s.name: s.table.front for s in problem.spaces}  # records built when picked
    cap = problem.caps
    pts = {s.name: stage_points(s.table, problem.levels, cap) for s in problem.spaces}
    lanes = wf.lanes
    fast: dict[str, list[tuple[float, tuple[int, ...]]]]
    if len(problem.levels) == 1:
        fast = {
            s.name: [(lat, (g,)) for g, lat in s.table.fastest if g <= cap[0]] for s in problem.spaces
        }
    else:
        fast = {n: _fastest(p, cap) for n, p in pts.items()}
    # Per lane and phase: the phase's relaxed minimum (co-residency ignored); per model-stage
    # and point, a lower bound of a plan's latency when it uses the point.
    lbs = [[_relaxed_min([fast[n] for n in phase], cap) for phase in lane] for lane in lanes]
    need: dict[str, Sequence[float]] = {}
    for lane, lb in zip(lanes, lbs, strict=True):
        for k, phase in enumerate(lane):
            other = (sum(lb) - lb[k]) * (1 - 1e-12)
            need.update((n, [p[0] + other for p in pts[n]]) for n in phase)
    floor_s = max((sum(lb) for lb in lbs), default=0.0)
    if floor_s == float("inf"):
        return None
    if len(lanes) == 2:
        floor_s = max(floor_s, _split_floor(lanes, fast, cap))
    first, *rest = ROUNDS
    got = _solve_within(problem, pts, fronts, lbs, need, floor_s * (1.0 + first) * (1.0 + 1e-12))
    if got is not None:
        return got
    rounds: list[float | None] = [*rest, None]
    if len(problem.levels) == 1 and sum(len(p) for p in pts.values()) >= MEMORY_BOUND_POINTS:
        # the optimum is above the relaxed floor (co-residency binds) and the space is large:
        # the memory-aware bounds (exact floor for one lane) keep the rounds narrow
        mem_floor = 0.0
        for lane in lanes:
            b = lane_bounds([[pts[n] for n in phase] for phase in lane], cap[0],
                            problem.capacity_bytes)
            if b.floor_s == float("inf"):
                return None
            mem_floor = max(mem_floor, b.floor_s)
            for phase, per_stage in zip(lane, b.need_s, strict=True):
                for n, nd in zip(phase, per_stage, strict=True):
                    need[n] = [max(a, c) for a, c in zip(need[n], nd, strict=True)]
        floor_s = max(floor_s, mem_floor)
        rounds = [*ROUNDS, None]
    for slack in rounds:
        limit = float("inf") if slack is None else floor_s * (1.0 + slack) * (1.0 + 1e-12)
        got = _solve_within(problem, pts, fronts, lbs, need, limit)
        if got is not None:
            return got
    return None


def _solve_within(
    problem: Problem,
    pts: dict[str, Sequence[Point]],
    fronts: Mapping[str, Sequence[Costed]],
    lbs: list[list[float]],
    need: Mapping[str, Sequence[float]],
    limit: float,
) -> dict[str, Costed] | None:
    wf, cap, capacity = problem.workflow, problem.caps, problem.capacity_bytes
    lane_opts: list[list[list[Point]]] = []
    rests: list[list[float]] = []
    for lane, lb in zip(wf.lanes, lbs, strict=True):
        opts = [phase_options([pts[n] for n in phase], cap, limit, [need[n] for n in phase])
                for phase in lane]
        lane_opts.append(opts)
        rests.append([sum(lb[k + 1 :]) * (1 - 1e-12) for k in range(len(lane))])

    def picks_to_choice(lane: Sequence[Sequence[str]], picks: tuple[int, ...]) -> dict[str, Costed]:
        names = [n for phase in lane for n in phase]
        return {n: fronts[n][i] for n, i in zip(names, picks, strict=True)}

    if len(wf.lanes) == 1:
        got = solve_lane(lane_opts[0], cap, capacity, False, rests[0], limit)
        return picks_to_choice(wf.lanes[0], got[0][4]) if got else None
    # All lanes but the last: their Pareto (latency, demand) solutions.
    heads: list[list[Point]] = []
    for opts, rest in zip(lane_opts[:-1], rests[:-1], strict=True):
        states = solve_lane(opts, cap, capacity, True, rest, limit)
        heads.append(pareto([(s[0], s[1], 0, 0, s[4]) for s in states]))
    best: tuple[float, tuple[tuple[int, ...], ...]] | None = None
    memo: dict[tuple[int, ...], Point | None] = {}

    def rec(k: int, used: tuple[int, ...], lat: float, chosen: tuple[tuple[int, ...], ...]) -> None:
        nonlocal best
        if best is not None and lat > best[0]:
            return
        if k == len(heads):
            left = tuple(c - u for c, u in zip(cap, used, strict=True))
            if left not in memo:
                got = solve_lane(lane_opts[-1], left, capacity, False, rests[-1], limit)
                memo[left] = got[0] if got else None
            tail = memo[left]
            if tail is None:
                return
            cand = (max(lat, tail[0]), (*chosen, tail[4]))
            if best is None or cand < best:
                best = cand
            return
        for s in heads[k]:
            nu = tuple(a + b for a, b in zip(used, s[1], strict=True))
            if _fits(nu, cap):
                rec(k + 1, nu, max(lat, s[0]), (*chosen, s[4]))

    rec(0, tuple(0 for _ in cap), 0.0, ())
    if best is None:
        return None
    choice: dict[str, Costed] = {}
    for lane, picks in zip(wf.lanes, best[1], strict=True):
        choice.update(picks_to_choice(lane, picks))
    return choice
