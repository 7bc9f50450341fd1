"""Every way a plan change can run, tried in order of cost: the one planned transition the
controller weighs for a target (pure; DESIGN.md §2.1, §2.3; issue 32).

1. the transition DAG of EMU primitives (:func:`nereus.transition.planned.plan_transition`);
2. where device memory (or a circular wait) blocks every order of it, the host-staged
   transition (:mod:`nereus.transition.staged`);
3. where frozen copies (actor-gen, critic-inf) lost every replica but their trained sources
   kept one, the DAG (or host-staged DAG) of the rest followed by the copies rebuilt from their
   sources (:mod:`nereus.transition.rebuild`);
4. where no DAG exists at all, gather-and-reload in process, or checkpoint/restart
   (:mod:`nereus.transition.fallbacks`).

:func:`plan_change` never fails: a target the job can reach at all is reachable by a
checkpoint/restart. The :class:`~nereus.transition.planned.PlannedTransition` says which way
(``executor``), what it costs (``cost_s``) and, for the ways after the first, why the earlier
ones did not do (``restart_reason`` / ``staged.reason``).
"""

from __future__ import annotations

from collections.abc import Sequence

from nereus.cost.calibration import Calibration
from nereus.errors import InfeasiblePlanError, TransitionError
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan
from nereus.transition.fallbacks import fallback_transition
from nereus.transition.planned import PlannedTransition, plan_transition
from nereus.transition.rebuild import plan_rebuild, rebuildable
from nereus.transition.staged import plan_staged


def plan_change(setup: Setup, current: ExecutionPlan, target: ExecutionPlan,
                pool: Sequence[int] | None = None, calib: Calibration | None = None,
                *, staging: bool = True) -> PlannedTransition:
    """The planned change from ``current`` (its units alive on ``pool``) to ``target``: the
    DAG, else (``staging``) the host-staged DAG, else — lost frozen copies — the DAG of the
    rest and the copies rebuilt, else gather-and-reload, else checkpoint/restart."""
    try:
        return plan_transition(setup, current, target, pool, calib)
    except (TransitionError, InfeasiblePlanError) as e:
        why = str(e)
    if "was lost" in why and rebuildable(setup, current, pool)[1]:
        try:
            return plan_rebuild(setup, current, target, pool, calib, staging=staging)
        except (TransitionError, InfeasiblePlanError) as e:
            why = f"{why}; rebuilding the copies from their sources: {e}"
    if staging and "was lost" not in why:
        try:
            return plan_staged(setup, current, target, pool, calib, why)
        except (TransitionError, InfeasiblePlanError) as e:
            why = str(e)
    return fallback_transition(setup, current, target, pool, calib, why)
