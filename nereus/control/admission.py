"""Admission: is a target plan worth its transition? (DESIGN.md §2.1, "Admit")."""

from __future__ import annotations

import math
from dataclasses import dataclass

from nereus.spec.plan import ExecutionPlan
from nereus.transition.planned import PlannedTransition


@dataclass(frozen=True)
class PlanOption:
    """A plan with its predicted step latency and the planned transition to it from the current
    plan; ``transition`` is None when no executable transition exists (the target fails the
    feasibility check) or there is no current plan."""

    plan: ExecutionPlan
    step_s: float
    transition: PlannedTransition | None

    @property
    def transition_s(self) -> float | None:
        """L̂_tran, or None when no executable transition exists."""
        return None if self.transition is None else self.transition.cost_s


@dataclass(frozen=True)
class Admission:
    admitted: bool
    path: str  # "urgent" | "opportunistic" | "restart" | "none"
    reason: str
    target: ExecutionPlan | None = None
    delta_l_s: float = 0.0  # predicted step-latency gain of the target over the current plan
    transition_s: float = 0.0
    horizon_steps: float = 0.0
    transition: PlannedTransition | None = None  # the admitted target's, planned once


def payback_ok(delta_l_s: float, transition_s: float, gamma: float, horizon_steps: float) -> bool:
    """ΔL > 0 and L̂_tran / ΔL ≤ γ · H_x."""
    if gamma <= 0.0 or delta_l_s <= 0.0:
        return False
    return transition_s / delta_l_s <= gamma * horizon_steps


def admit_urgent(options: tuple[PlanOption, ...]) -> Admission:
    """The current plan is infeasible: take the fastest target with a transition DAG, waiving
    profitability (DESIGN.md §2.1); only where no target has one, the fastest whose transition is
    the in-process checkpoint/restart a port may plan instead (gather and reload: a node loss
    with S* reshaping a model-stage, while a slightly slower target keeps its units); with no
    transition at all, checkpoint/restart into the fastest."""
    ranked = sorted((opt for opt in options if opt.transition is not None),
                    key=lambda o: o.transition.executor != "dag")  # type: ignore[union-attr]
    for opt in ranked:  # a stable sort: fastest first within each kind
        assert opt.transition is not None
        return Admission(
            True, "urgent", "current plan infeasible; fastest executable target"
            + ("" if opt.transition.executor == "dag" else " (no target has a DAG)"),
            opt.plan, transition_s=opt.transition.cost_s, transition=opt.transition,
        )
    if options:
        return Admission(
            True, "restart", "no executable transition; checkpoint/restart into the fastest plan",
            options[0].plan,
        )
    return Admission(False, "none", "current plan infeasible and no feasible plan exists")


def admit_opportunistic(
    current_step_s: float,
    options: tuple[PlanOption, ...],
    gamma: float,
    horizon_steps: float,
) -> Admission:
    """Admit the fastest option whose transition pays back within γ·H_x steps.

    ``options`` are sorted fastest first (S* first); when S* fails (no executable DAG or too
    expensive to pay back), the slightly slower options with cheaper transitions are tried in
    order before keeping the current plan.
    """
    if gamma <= 0.0:
        return Admission(False, "opportunistic", "gamma = 0 admits only urgent transitions")
    if not options:
        return Admission(False, "opportunistic", "no feasible target")
    best_reason = ""
    for i, opt in enumerate(options):
        delta = current_step_s - opt.step_s
        if delta <= 0.0 or math.isclose(delta, 0.0, abs_tol=1e-12):
            best_reason = best_reason or "no target is faster than the current plan"
            break  # options are sorted: every later one is slower still
        if opt.transition is None:
            best_reason = best_reason or f"S* has no executable transition (option {i})"
            continue
        cost_s = opt.transition.cost_s
        if payback_ok(delta, cost_s, gamma, horizon_steps):
            why = "S*" if i == 0 else f"fallback option {i} (S* failed: {best_reason})"
            return Admission(
                True, "opportunistic",
                f"{why}: payback {cost_s / delta:.2f} steps <= "
                f"gamma*H = {gamma * horizon_steps:.2f}",
                opt.plan, delta, cost_s, horizon_steps, opt.transition,
            )
        best_reason = best_reason or (
            f"payback {cost_s / delta:.2f} steps > gamma*H = {gamma * horizon_steps:.2f}"
        )
    s_star = options[0]
    return Admission(
        False, "opportunistic", best_reason, None,
        current_step_s - s_star.step_s, s_star.transition_s or 0.0, horizon_steps,
    )
