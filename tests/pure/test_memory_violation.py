"""Tier 1 (pure): a measured memory violation (a device refused an allocation during the step)
makes the replan urgent even where the memory model still predicts the plan fits."""

from __future__ import annotations

from nereus.control.controller import ControllerState, PlanEvaluation, controller_step
from nereus.control.signals import MEMORY, Observation
from nereus.spec.job import ControllerSpec
from nereus.spec.plan import ExecutionPlan, StagePlan
from nereus.transition.planned import PlannedTransition

POOL = tuple(range(4))
A = ExecutionPlan((StagePlan("actor-train", 1, 1, 4, 1, 1, replicas=((0,), (1,), (2,), (3,))),))
B = ExecutionPlan((StagePlan("actor-train", 2, 1, 2, 1, 1, replicas=((0, 1), (2, 3))),))


class Port:
    """A predicts 10 s and fits; B predicts 12 s; a transition costs 100 s (never profitable).
    Once A runs, the planner offers B (a layout that splits A's state)."""

    def evaluate(self, plan: ExecutionPlan, obs: Observation) -> PlanEvaluation:
        return PlanEvaluation({A: 10.0, B: 12.0}[plan], True, "")

    def options(self, obs: Observation, current: ExecutionPlan | None
                ) -> list[tuple[ExecutionPlan, float]]:
        return [(A, 10.0)] if current is None else [(B, 12.0)]

    def transition(self, current: ExecutionPlan, target: ExecutionPlan) -> PlannedTransition:
        return PlannedTransition.restart(100.0, "test double")


def test_an_observed_oom_is_urgent_and_waives_profitability() -> None:
    spec, port = ControllerSpec(), Port()
    st, _ = controller_step(ControllerState(), Observation(0, 100.0, 120.0, POOL), spec, port)
    assert st.plan == A
    quiet, d = controller_step(st, Observation(1, 100.0, 120.0, POOL), spec, port)
    assert not d.replanned and quiet.plan == A  # nothing drifted, the plan fits
    drift, d = controller_step(st, Observation(1, 200.0, 240.0, POOL), spec, port)
    assert d.replanned and not d.urgent and drift.plan == A  # B: slower, 100 s: rejected
    st2, d = controller_step(st, Observation(1, 100.0, 120.0, POOL, memory_violation=True),
                             spec, port)
    assert d.urgent and MEMORY in d.triggers and d.replanned
    assert d.admission is not None and d.admission.path == "urgent" and d.admission.admitted
    assert st2.plan == B  # the first executable option, the transition's cost waived
