"""The order rank 0 sends every rank when the plan changes at a step boundary (pure data).

One record, one message: the target plan, the pool, why, and the planned transition's DAG (or
why there is none), with L̂_tran read from the same :class:`~nereus.transition.PlannedTransition`
that admission weighed. The ranks execute it as it is: nothing downstream plans again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nereus.spec.plan import ExecutionPlan
from nereus.transition.dag import TransitionDag
from nereus.transition.planned import PlannedTransition
from nereus.transition.staged import StagedTransition
from nereus.transition.wire import dag_from_wire, dag_to_wire, staged_from_wire, staged_to_wire


@dataclass(frozen=True)
class PlanChangeOrder:
    """What rank 0 sends every rank when the plan changes at a boundary, in one message: the
    target plan, the pool it runs on, why (``kind``: urgent / opportunistic / forced), and how —
    the transition DAG, the host-staged transition (``staged``: some model-stages parked in host
    memory around the DAG of the others), or (``dag`` and ``staged`` None) why the state is
    gathered and reloaded instead. ``predicted_s`` is L̂_tran of that same planned transition;
    ``compilations`` how often rank 0 planned it (once: the decision carries it from admission
    to the ranks). ``rebuilt``: frozen copies whose every replica left the pool, built after
    the DAG (or staged change) from their sources (:mod:`nereus.transition.rebuild`)."""

    target: ExecutionPlan
    pool: tuple[int, ...]
    kind: str
    predicted_s: float
    dag: TransitionDag | None
    reason: str = ""
    compilations: int = 1
    staged: StagedTransition | None = None
    rebuilt: tuple[str, ...] = ()  # frozen copies built after the DAG from their sources

    @staticmethod
    def of(target: ExecutionPlan, pool: Sequence[int], kind: str, planned: PlannedTransition,
           compilations: int) -> PlanChangeOrder:
        dag = planned.dag if planned.executor == "dag" else None
        reason = planned.staged.reason if planned.staged is not None else planned.restart_reason
        return PlanChangeOrder(target, tuple(pool), kind, planned.cost_s, dag, reason,
                               compilations, planned.staged,
                               tuple(rb.model_stage for rb in planned.rebuilt))

    def to_wire(self) -> dict[str, Any]:
        return {"plan": self.target.to_dict(), "pool": list(self.pool), "kind": self.kind,
                "predicted_s": self.predicted_s,
                "dag": None if self.dag is None else dag_to_wire(self.dag),
                "reason": self.reason, "compilations": self.compilations,
                "staged": None if self.staged is None else staged_to_wire(self.staged),
                "rebuilt": list(self.rebuilt)}

    @staticmethod
    def from_wire(d: dict[str, Any]) -> PlanChangeOrder:
        staged = d.get("staged")
        return PlanChangeOrder(ExecutionPlan.from_dict(d["plan"]), tuple(int(g) for g in d["pool"]),
                               str(d["kind"]), float(d["predicted_s"]),
                               None if d["dag"] is None else dag_from_wire(d["dag"]),
                               str(d["reason"]), int(d["compilations"]),
                               None if staged is None else staged_from_wire(staged),
                               tuple(str(n) for n in d.get("rebuilt", ())))
