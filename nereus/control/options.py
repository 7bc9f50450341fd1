"""The candidate targets of a replan: S* and a few slower plans with cheaper transitions (pure).

Admission (:mod:`nereus.control.admission`) weighs each candidate with its planned transition,
so the candidates are chosen to span the trade-off between step time and transition cost:

1. **S*** — the fastest plan on the pool;
2. **refit** — every model-stage keeps its current TP/PP, only DP and placement are searched
   (Extend / Destroy only where the placement allows: the cheapest change that uses the pool);
3. **S* keeping one model-stage** — the fastest plan that keeps one more model-stage at its
   current TP/PP, for the model-stages S* would re-layout, the largest state first (the most
   bytes to reshard, the most memory its old and new layouts need together).

At most ``limit`` distinct plans (``ControllerSpec.targets``), fastest first; S* alone when it
is the current plan (every other target is slower). Every candidate is one plan search on the
same cost tables (the first search of a replan costs them, the others reuse them:
:class:`nereus.plan.candidates.CostCache`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan
from nereus.transition.fallbacks import stage_state_bytes

Found = tuple[ExecutionPlan, float] | None
Search = Callable[[Mapping[str, tuple[int, ...]] | None], Found]


def candidate_targets(search: Search, setup: Setup, current: ExecutionPlan | None,
                      limit: int) -> list[tuple[ExecutionPlan, float]]:
    """The candidates above, fastest first; ``search(layouts)`` is the plan search with the
    (tp, pp) of the model-stages in ``layouts`` pinned (None: nothing pinned)."""
    out: list[tuple[ExecutionPlan, float]] = []

    def add(found: Found) -> None:
        if found is not None and all(found[0] != p for p, _ in out):
            out.append(found)

    best = search(None)
    add(best)
    if best is not None and best[0] == current:
        return out  # the current plan is the fastest: every other target is slower still
    if current is not None and limit > 1:
        keep = {sp.name: (sp.tp, sp.pp) for sp in current.stages}
        add(search(keep))
        if best is not None:
            moved = [sp.name for sp in best[0].stages
                     if sp.name in keep and (sp.tp, sp.pp) != keep[sp.name]]
            moved.sort(key=lambda n: (-stage_state_bytes(setup, n), n))
            for name in moved:
                if len(out) >= limit:
                    break
                add(search({name: keep[name]}))
    out.sort(key=lambda o: o[1])
    return out[:max(1, limit)]
