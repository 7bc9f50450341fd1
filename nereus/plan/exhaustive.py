"""Exact reference: every combination of every feasible candidate (not only frontier ones).

Same plan space and feasibility as the DP (``nereus.plan.problem``). Partial combinations that
already break a GPU budget or the memory bound are cut (both only grow as model-stages are
added), which leaves the enumeration exact. For small instances: the work is bounded by a
deterministic count of visited combinations instead of a clock.
"""

from __future__ import annotations

from nereus.errors import NereusError
from nereus.plan.candidates import Costed
from nereus.plan.problem import Problem, step_s

# Combinations visited per second of ``time_limit_s`` (a nominal rate; no clock is read).
VISITS_PER_SECOND = 200_000


class SearchLimitError(NereusError):
    """An exact reference search stopped at its work limit without a proven optimum."""


def _partial_ok(problem: Problem, chosen: dict[str, Costed]) -> bool:
    wf = problem.workflow
    total = [0] * len(problem.levels)
    for lane in wf.lanes:
        p_sum = 0
        excess = 0
        for phase in lane:
            picked = [chosen[n] for n in phase if n in chosen]
            if picked:
                p = max(c.persistent_bytes for c in picked)
                p_sum += p
                excess = max(excess, max(c.peak_bytes for c in picked) - p)
        if p_sum + excess > problem.capacity_bytes:
            return False
        for k in range(len(total)):
            total[k] += max(
                (sum(problem.demand(chosen[n])[k] for n in phase if n in chosen) for phase in lane),
                default=0,
            )
    return all(t <= c for t, c in zip(total, problem.caps, strict=True))


def solve(problem: Problem, max_visits: int) -> dict[str, Costed] | None:
    """The optimal choice, or None if none is feasible; ``SearchLimitError`` past ``max_visits``."""
    names = [n for lane in problem.workflow.lanes for phase in lane for n in phase]
    spaces = {s.name: s.feasible for s in problem.spaces}
    best: tuple[float, tuple[tuple[int, int, int, int, int, bool], ...]] | None = None
    best_choice: dict[str, Costed] | None = None
    visits = 0
    chosen: dict[str, Costed] = {}

    def rec(k: int) -> None:
        nonlocal best, best_choice, visits
        if k == len(names):
            key = (step_s(problem, chosen), tuple(chosen[n].key for n in names))
            if best is None or key < best:
                best = key
                best_choice = dict(chosen)
            return
        name = names[k]
        for c in spaces[name]:
            visits += 1
            if visits > max_visits:
                raise SearchLimitError(f"exhaustive search stopped after {max_visits} combinations")
            chosen[name] = c
            if _partial_ok(problem, chosen):
                rec(k + 1)
            del chosen[name]

    rec(0)
    return best_choice
