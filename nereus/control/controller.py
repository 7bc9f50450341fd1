"""The controller state machine: observe → trigger → replan → admit, deterministic and pure.

The planner and the transition-cost estimate come in through a :class:`PlannerPort` (pure
functions of their inputs), so the same controller drives the simulator and the real runtime, and
its whole state serializes to plain data so that any rank can take over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from nereus.control.admission import (
    Admission,
    PlanOption,
    admit_opportunistic,
    admit_urgent,
    plan_lazily,
)
from nereus.control.exposure import PoolHistory
from nereus.control.horizon import SignalHorizon
from nereus.control.signals import EFFICIENCY_PREFIX, GEN_LEN, MEMORY, POOL, Observation
from nereus.spec.job import ControllerSpec
from nereus.spec.plan import ExecutionPlan
from nereus.transition.planned import PlannedTransition


@dataclass(frozen=True)
class PlanEvaluation:
    step_s: float
    feasible: bool
    reason: str = ""


class PlannerPort(Protocol):
    def evaluate(self, plan: ExecutionPlan, obs: Observation) -> PlanEvaluation:
        """Predicted step latency of ``plan`` under ``obs`` and whether it still fits."""
        ...

    def options(self, obs: Observation, current: ExecutionPlan | None) -> Sequence[tuple[ExecutionPlan, float]]:
        """Feasible target plans with predicted step latency, fastest (S*) first; later entries
        are slightly slower plans with cheaper transitions from ``current`` (a bounded number:
        :mod:`nereus.control.options`)."""
        ...

    def transition(self, current: ExecutionPlan, target: ExecutionPlan
                   ) -> PlannedTransition | None:
        """The planned transition (its DAG, host-staged DAG, gather-and-reload or
        checkpoint/restart, and L̂_tran: :func:`nereus.transition.change.plan_change`), or None
        when none is executable. The decision carries it from here to the ranks: nothing
        downstream plans it again."""
        ...


@dataclass(frozen=True)
class Decision:
    step: int
    triggers: tuple[str, ...]
    urgent: bool
    replanned: bool
    deferred: bool = False
    admission: Admission | None = None
    lost_gpus: tuple[int, ...] = ()
    current_step_s: float = 0.0


@dataclass(frozen=True)
class ControllerState:
    plan: ExecutionPlan | None = None
    pool: tuple[int, ...] = ()
    references: tuple[tuple[str, float], ...] = ()
    horizons: tuple[tuple[str, SignalHorizon], ...] = ()
    pending: tuple[str, ...] = ()
    replans: int = 0
    transitions: int = 0
    # the pool as observed while a plan runs: loss exposure's rates
    pool_history: PoolHistory = field(default_factory=PoolHistory)

    def horizon(self, name: str) -> SignalHorizon:
        return dict(self.horizons).get(name, SignalHorizon())

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": None if self.plan is None else self.plan.to_dict(),
            "pool": list(self.pool),
            "references": [[k, v] for k, v in self.references],
            "horizons": [[k, h.to_dict()] for k, h in self.horizons],
            "pending": list(self.pending),
            "replans": self.replans,
            "transitions": self.transitions,
            "pool_history": self.pool_history.to_dict(),
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ControllerState:
        return ControllerState(
            plan=None if d["plan"] is None else ExecutionPlan.from_dict(d["plan"]),
            pool=tuple(int(g) for g in d["pool"]),
            references=tuple((str(k), float(v)) for k, v in d["references"]),
            horizons=tuple((str(k), SignalHorizon.from_dict(h)) for k, h in d["horizons"]),
            pending=tuple(str(p) for p in d["pending"]),
            replans=int(d["replans"]),
            transitions=int(d["transitions"]),
            pool_history=(PoolHistory.from_dict(d["pool_history"]) if "pool_history" in d
                          else PoolHistory()),
        )


def threshold(spec: ControllerSpec, name: str) -> float:
    if name == GEN_LEN:
        return spec.delta_len
    if name.startswith(EFFICIENCY_PREFIX):
        return spec.delta_efficiency
    raise KeyError(name)


def drift_crossings(
    references: dict[str, float], values: dict[str, float], spec: ControllerSpec
) -> tuple[str, ...]:
    """Drifting signals whose value differs from its reference by more than δ_x (relative)."""
    out = []
    for name in sorted(values):
        ref = references.get(name)
        if ref is None:
            continue
        base = abs(ref) if ref != 0 else 1.0
        if abs(values[name] - ref) / base > threshold(spec, name):
            out.append(name)
    return tuple(out)


def controller_step(
    state: ControllerState, obs: Observation, spec: ControllerSpec, port: PlannerPort
) -> tuple[ControllerState, Decision]:
    """One pass at a safe boundary; returns the new state and what was decided."""
    values = obs.drifting_values()
    refs = dict(state.references)
    for name, v in values.items():  # a signal seen for the first time becomes its own reference
        refs.setdefault(name, v)

    crossings = list(drift_crossings(dict(state.references), values, spec))
    if state.pool and tuple(obs.pool) != tuple(state.pool):
        crossings.insert(0, POOL)
    horizons = dict(state.horizons)
    for name in crossings:
        horizons[name] = horizons.get(name, SignalHorizon()).crossed(obs.step, spec.horizon_alpha)

    pool_set = set(obs.pool)
    lost: tuple[int, ...] = ()
    current_eval = PlanEvaluation(float("inf"), False, "no plan yet")
    if state.plan is not None:
        lost = tuple(g for sp in state.plan.stages for g in sp.gpus if g not in pool_set)
        lost = tuple(sorted(set(lost)))
        current_eval = port.evaluate(state.plan, obs) if not lost else PlanEvaluation(
            float("inf"), False, f"GPUs lost: {list(lost)}"
        )
    triggers = list(dict.fromkeys([*state.pending, *crossings]))
    urgent = state.plan is None or bool(lost) or not current_eval.feasible \
        or obs.memory_violation
    if urgent and state.plan is not None and not lost:
        triggers.append(MEMORY)
    if state.plan is None:
        triggers.append("initial")

    new_state = replace(
        state,
        references=tuple(sorted(refs.items())),
        horizons=tuple(sorted(horizons.items())),
        pool=tuple(obs.pool) if not state.pool else state.pool,
        # the pool's changes while a plan runs (not the wait for a first feasible pool)
        pool_history=(state.pool_history.observed(tuple(obs.pool)) if state.plan is not None
                      else PoolHistory(tuple(obs.pool))),
    )
    if not triggers:
        return new_state, Decision(obs.step, (), False, False, current_step_s=current_eval.step_s)

    if obs.transition_running and not lost:
        # A replan starts when the running transition ends, or at once if GPUs were lost.
        deferred = replace(new_state, pending=tuple(triggers))
        return deferred, Decision(
            obs.step, tuple(triggers), urgent, False, deferred=True,
            current_step_s=current_eval.step_s,
        )

    stage_times = getattr(port, "stage_times", None)  # optional: the tie rule's finer band
    options = tuple(
        PlanOption(
            plan,
            step_s,
            None,
            () if stage_times is None or state.plan is None
            else tuple(sorted(stage_times(plan, obs).items())),
        )
        for plan, step_s in port.options(obs, state.plan)
    )
    if urgent and state.plan is not None:
        # The current plan cannot go on (a device refused an allocation, or the model finds it
        # over capacity): it is no target, even where the search, whose memory model did not
        # foresee the refusal, offers it — unless nothing else is on offer.
        others = tuple(o for o in options if o.plan != state.plan)
        options = others or options
    horizon = min(
        (horizons[t].horizon_steps for t in triggers if t in horizons),
        default=SignalHorizon().horizon_steps,
    )
    exposure = getattr(port, "exposure", None)  # optional: the loss exposure of a plan
    current_exposure_s = 0.0
    history = new_state.pool_history
    if spec.loss_exposure and exposure is not None and state.plan is not None \
            and history.changes:
        options = tuple(replace(o, exposure_s=exposure(o.plan, history, horizon))
                        for o in options)
        if not urgent:
            current_exposure_s = exposure(state.plan, history, horizon)
    if state.plan is not None:  # transitions planned where admission could choose them
        current = state.plan
        options = plan_lazily(options, lambda p: port.transition(current, p), urgent=urgent,
                              current_step_s=current_eval.step_s, gamma=spec.gamma,
                              horizon_steps=horizon, model_error=spec.model_error,
                              current_exposure_s=current_exposure_s)
    if state.plan is None:
        admission = (
            Admission(True, "initial", "initial plan", options[0].plan)
            if options
            else Admission(False, "none", "no feasible initial plan")
        )
    elif urgent:
        admission = admit_urgent(options, horizon, spec.model_error)
    else:
        admission = admit_opportunistic(current_eval.step_s, options, spec.gamma, horizon,
                                        spec.model_error, current_exposure_s)

    # References reset after every replan, even when the transition is rejected.
    after = replace(
        new_state,
        references=tuple(sorted(values.items())),
        pool=tuple(obs.pool),
        pending=(),
        replans=state.replans + 1,
    )
    if admission.admitted and admission.target is not None:
        after = replace(
            after,
            plan=admission.target,
            transitions=state.transitions + (0 if state.plan is None else 1),
        )
    return after, Decision(
        obs.step, tuple(triggers), urgent, True, admission=admission, lost_gpus=lost,
        current_step_s=current_eval.step_s,
    )
