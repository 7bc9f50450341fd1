"""Admission: which target, if any, is worth its transition? (DESIGN.md §2.1, "Admit").

Every replan weighs a few candidate targets (:mod:`nereus.control.options`), each with its
planned transition — a DAG, a host-staged DAG, gather-and-reload or checkpoint/restart, with its
L̂_tran — and records a verdict for every one (:class:`OptionRecord`, logged with the replan).

- **Opportunistic** (the current plan still runs): a target is *admissible* when it is faster
  (ΔL > 0) and pays back within γ·H_x steps (L̂_tran / ΔL ≤ γ·H_x). Of the admissible targets
  the one with the best *payback value* ΔL·H_x − L̂_tran is admitted.
- **Urgent** (the current plan cannot go on): profitability is waived; of the targets the one
  with the least predicted time over the horizon, step·H_x + L̂_tran, is admitted (a
  checkpoint/restart only where it is still the least: path ``restart``).
- **Tie rule** (transition-aware search): targets whose predicted step times differ by less than
  the model's error cannot be told apart by the cost model; among the targets tied with the one
  chosen above, the cheapest transition wins. The model's error is ε
  (``ControllerSpec.model_error``, relative) of the predicted seconds of the model-stages in
  which the two targets differ (:func:`tie_band_s`): two plans that share most model-stages
  share their errors there, so only the differing part can reorder them.
- **Loss exposure** (:mod:`nereus.control.exposure`): once the pool has shrunk, each plan —
  the current one and every target — carries the seconds it expects to lose to a
  checkpoint/restart within the horizon; they count with its steps: ΔL above is
  (current step + its exposure / H) − (target step + its exposure / H), urgent totals are
  step·H + exposure + L̂_tran, and the tie rule's cheapest is the least L̂_tran + exposure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

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
    stage_s: tuple[tuple[str, float], ...] = ()  # predicted seconds per model-stage, if known
    skipped: str = ""  # why no transition was planned for it (it cannot be chosen: plan_lazily)
    exposure_s: float = 0.0  # expected restart seconds within the horizon (control.exposure)

    @property
    def transition_s(self) -> float | None:
        """L̂_tran, or None when no executable transition exists."""
        return None if self.transition is None else self.transition.cost_s


@dataclass(frozen=True)
class OptionRecord:
    """One target a replan considered, and what admission made of it."""

    index: int  # its place among the options, fastest first (0: S*)
    label: str  # (dp, tp, pp) per model-stage
    step_s: float
    delta_l_s: float  # current step time − this target's (inf when the current plan cannot run)
    transition_s: float | None  # L̂_tran (None: no executable transition)
    executor: str  # "dag" | "staged" | "gather-reload" | "restart" | "none" | "not planned"
    admitted: bool
    reason: str  # admission's verdict
    why_executor: str = ""  # why not a cheaper way (no DAG fits memory, every replica lost …)
    exposure_s: float = 0.0  # its loss exposure over the horizon (control.exposure)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "plan": self.label, "step_s": self.step_s,
                "delta_l_s": self.delta_l_s, "transition_s": self.transition_s,
                "executor": self.executor, "admitted": self.admitted, "reason": self.reason,
                "why_executor": self.why_executor, "exposure_s": self.exposure_s}


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
    options: tuple[OptionRecord, ...] = ()  # every target considered, with its verdict
    current_exposure_s: float = 0.0  # the current plan's loss exposure (control.exposure)


def payback_ok(delta_l_s: float, transition_s: float, gamma: float, horizon_steps: float) -> bool:
    """ΔL > 0 and L̂_tran / ΔL ≤ γ · H_x."""
    if gamma <= 0.0 or delta_l_s <= 0.0:
        return False
    return transition_s / delta_l_s <= gamma * horizon_steps


def plan_label(plan: ExecutionPlan) -> str:
    return " ".join(f"{sp.name}=({sp.dp},{sp.tp},{sp.pp})" for sp in plan.stages)


def tie_band_s(a: PlanOption, b: PlanOption, model_error: float) -> float:
    """How far apart two targets' predicted step times may be and still tie: the model's
    relative error on the part of the step in which they differ — the predicted seconds of the
    model-stages whose layout or batch split differs (the larger of the two), where both
    options carry their stage times; else on the whole (shorter) step."""
    if a.stage_s and b.stage_s:
        ta, tb = dict(a.stage_s), dict(b.stage_s)
        ca = {sp.name: sp.candidate for sp in a.plan.stages}
        cb = {sp.name: sp.candidate for sp in b.plan.stages}
        differ = [n for n in ca if ca[n] != cb.get(n)]
        return model_error * sum(max(ta.get(n, 0.0), tb.get(n, 0.0)) for n in differ)
    return model_error * min(a.step_s, b.step_s)


def ties(a: PlanOption, b: PlanOption, model_error: float) -> bool:
    """Whether two targets are within the model's error of each other (:func:`tie_band_s`)."""
    return abs(a.step_s - b.step_s) <= tie_band_s(a, b, model_error)


def _tie_break(chosen: int, options: Sequence[PlanOption], candidates: Sequence[int],
               model_error: float) -> int:
    """The cheapest transition (with its exposure) among ``candidates`` tied with ``chosen``
    (ties: faster)."""
    tied = [i for i in candidates if ties(options[i], options[chosen], model_error)]
    return min(tied, key=lambda i: ((options[i].transition_s or 0.0) + options[i].exposure_s,
                                    options[i].step_s, i))


def effective_step_s(step_s: float, exposure_s: float, horizon_steps: float) -> float:
    """A step's seconds with the plan's loss exposure spread over the horizon."""
    return step_s + (exposure_s / horizon_steps if horizon_steps > 0.0 else 0.0)


def _record(i: int, opt: PlanOption, delta: float, admitted: bool, reason: str) -> OptionRecord:
    tr = opt.transition
    why = "" if tr is None else (tr.staged.reason if tr.staged is not None
                                 else tr.restart_reason)
    how = "not planned" if opt.skipped else "none" if tr is None else tr.executor
    return OptionRecord(i, plan_label(opt.plan), opt.step_s, delta,
                        None if tr is None else tr.cost_s, how, admitted, reason, why,
                        opt.exposure_s)


def admit_urgent(options: Sequence[PlanOption], horizon_steps: float = 1.0,
                 model_error: float = 0.0) -> Admission:
    """The current plan is infeasible: profitability waived, the target with the least
    step·H + L̂_tran (tie rule: cheaper transition) is admitted; options with no executable
    transition at all only when none has one (checkpoint/restart into the fastest)."""
    h = max(horizon_steps, 1.0)
    able = [i for i, o in enumerate(options) if o.transition is not None and not o.skipped]
    if not able and any(o.skipped for o in options):
        raise ValueError("every option skipped: plan_lazily plans at least one")
    if not options:
        return Admission(False, "none", "current plan infeasible and no feasible plan exists")
    if not able:
        first = tuple(_record(i, o, math.inf, i == 0, "no executable transition; "
                                "checkpoint/restart into the fastest" if i == 0 else
                                "no executable transition; slower than option 0")
                        for i, o in enumerate(options))
        return Admission(True, "restart", "no executable transition; checkpoint/restart into "
                         "the fastest plan", options[0].plan, options=first)

    def total(i: int) -> float:
        o = options[i]
        assert o.transition is not None
        return o.step_s * h + o.exposure_s + o.transition.cost_s

    best = min(able, key=lambda i: (total(i), options[i].step_s, i))
    pick = _tie_break(best, options, able, model_error)
    chosen = options[pick]
    assert chosen.transition is not None
    exp = " + exposure" if any(o.exposure_s for o in options) else ""
    why = (f"current plan infeasible; least step*H{exp} + L_tran = {total(pick):.2f} s over "
           f"H = {h:.2f} steps ({chosen.transition.executor})")
    if pick != best:
        why += (f"; within the model's error ({model_error:.0%}) of option {best}, whose "
                "transition costs more")
    records: list[OptionRecord] = []
    for i, o in enumerate(options):
        if i == pick:
            records.append(_record(i, o, math.inf, True, why))
        elif o.skipped:
            records.append(_record(i, o, math.inf, False, o.skipped))
        elif o.transition is None:
            records.append(_record(i, o, math.inf, False, "no executable transition"))
        elif i == best:
            records.append(_record(i, o, math.inf, False, f"tied with option {pick} within "
                                   "the model's error; its transition costs more"))
        else:
            records.append(_record(i, o, math.inf, False, f"step*H{exp} + L_tran = "
                                   f"{total(i):.2f} s > {total(best):.2f} s"))
    path = "restart" if chosen.transition.executor == "restart" else "urgent"
    return Admission(True, path, why, chosen.plan, transition_s=chosen.transition.cost_s,
                     horizon_steps=h, transition=chosen.transition, options=tuple(records))


def admit_opportunistic(
    current_step_s: float,
    options: Sequence[PlanOption],
    gamma: float,
    horizon_steps: float,
    model_error: float = 0.0,
    current_exposure_s: float = 0.0,
) -> Admission:
    """Admit the admissible option (faster, paying back within γ·H_x) with the best payback
    value ΔL·H_x − L̂_tran, the tie rule applied (module docstring); every option gets a
    verdict. ``options`` are sorted fastest first (S* first). With loss exposures (the options'
    and ``current_exposure_s``) ΔL compares steps with their exposure spread over H_x."""
    if gamma <= 0.0:
        return Admission(False, "opportunistic", "gamma = 0 admits only urgent transitions",
                         options=tuple(_record(i, o, current_step_s - o.step_s, False,
                                               "gamma = 0 admits only urgent transitions")
                                       for i, o in enumerate(options)))
    if not options:
        return Admission(False, "opportunistic", "no feasible target")
    h = horizon_steps
    current_eff = effective_step_s(current_step_s, current_exposure_s, h)

    def gain(o: PlanOption) -> float:
        return current_eff - effective_step_s(o.step_s, o.exposure_s, h)

    verdicts: list[str] = []
    able: list[int] = []
    for opt in options:
        delta = gain(opt)
        if delta <= 0.0 or math.isclose(delta, 0.0, abs_tol=1e-12):
            with_exp = ", exposure included" if opt.exposure_s or current_exposure_s else ""
            verdicts.append(f"not faster than the current plan{with_exp} (dL = {delta:.3g} s)")
        elif opt.skipped:
            verdicts.append(opt.skipped)
        elif opt.transition is None:
            verdicts.append("no executable transition")
        elif not payback_ok(delta, opt.transition.cost_s, gamma, h):
            verdicts.append(f"payback {opt.transition.cost_s / delta:.2f} steps > gamma*H = "
                            f"{gamma * h:.2f} ({opt.transition.executor})")
        else:
            verdicts.append("")
            able.append(len(verdicts) - 1)

    def value(i: int) -> float:
        o = options[i]
        assert o.transition is not None
        return gain(o) * h - o.transition.cost_s

    if not able:
        first = verdicts[0]
        if options[0].transition is None and gain(options[0]) > 0:
            first = "S* has no executable transition (option 0)"
        rejected = tuple(_record(i, o, current_step_s - o.step_s, False, verdicts[i])
                         for i, o in enumerate(options))
        s_star = options[0]
        return Admission(False, "opportunistic", first, None, current_step_s - s_star.step_s,
                         s_star.transition_s or 0.0, h, options=rejected,
                         current_exposure_s=current_exposure_s)
    best = max(able, key=lambda i: (value(i), -options[i].step_s, -i))
    pick = _tie_break(best, options, able, model_error)
    chosen = options[pick]
    assert chosen.transition is not None
    delta = gain(chosen)
    cost_s = chosen.transition.cost_s
    why = (f"payback {cost_s / delta:.2f} steps <= gamma*H = {gamma * h:.2f}; value "
           f"dL*H - L_tran = {value(pick):.2f} s ({chosen.transition.executor})")
    if pick != 0:
        why = f"fallback option {pick} (S* failed: {verdicts[0] or 'less payback'}): " + why
    if chosen.exposure_s or current_exposure_s:
        why += (f"; exposure {chosen.exposure_s:.2f} s against the current plan's "
                f"{current_exposure_s:.2f} s")
    if pick != best:
        why += (f"; within the model's error ({model_error:.0%}) of option {best}, whose "
                "transition costs more")
    records: list[OptionRecord] = []
    for i, o in enumerate(options):
        if i == pick:
            records.append(_record(i, o, current_step_s - o.step_s, True, why))
        elif verdicts[i]:
            records.append(_record(i, o, current_step_s - o.step_s, False, verdicts[i]))
        elif i == best:
            records.append(_record(i, o, current_step_s - o.step_s, False,
                                   f"tied with option {pick} within the model's error; its "
                                   "transition costs more"))
        else:
            records.append(_record(i, o, current_step_s - o.step_s, False,
                                   f"admissible, but value {value(i):.2f} s < "
                                   f"{value(best):.2f} s"))
    return Admission(True, "opportunistic", why, chosen.plan, delta, cost_s, h,
                     chosen.transition, tuple(records), current_exposure_s)


Planner = Callable[[ExecutionPlan], "PlannedTransition | None"]


def plan_lazily(options: Sequence[PlanOption], plan: Planner, *, urgent: bool,
                current_step_s: float, gamma: float, horizon_steps: float,
                model_error: float, current_exposure_s: float = 0.0) -> tuple[PlanOption, ...]:
    """``options`` (fastest first, no transitions yet) with their transitions planned by
    ``plan`` — but only where admission could choose them: an option whose best possible
    outcome (opportunistic: its whole gain over the horizon, ΔL·H, as if its transition were
    free; urgent: step·H) cannot beat an option already planned, and that is not tied with the
    chosen one by the tie rule, is ``skipped`` with the reason. Admission on the result is the
    same as with every transition planned (the bounds are exact); the planning time is not.
    Loss exposures count as admission counts them."""
    h = max(horizon_steps, 1.0) if urgent else horizon_steps
    current_eff = effective_step_s(current_step_s, current_exposure_s, h)
    out = list(options)
    best: int | None = None
    best_score = -math.inf  # opportunistic: value; urgent: −(step·H + L̂_tran)
    later: list[int] = []
    for i, o in enumerate(out):
        if not urgent:
            delta = current_eff - effective_step_s(o.step_s, o.exposure_s, h)
            if delta <= 0.0 or gamma <= 0.0:
                continue  # never admissible: no transition needed for its verdict
            bound = delta * h
        else:
            bound = -(o.step_s * h + o.exposure_s)
        if best is not None and bound <= best_score and not ties(o, out[best], model_error):
            later.append(i)
            continue
        tr = plan(o.plan)
        out[i] = replace(o, transition=tr)
        if tr is None:
            continue
        if urgent:
            score = -(o.step_s * h + o.exposure_s + tr.cost_s)
        elif payback_ok(delta, tr.cost_s, gamma, h):
            score = delta * h - tr.cost_s
        else:
            continue
        if best is None or score > best_score:
            best, best_score = i, score
    for i in later:
        o = out[i]
        assert best is not None
        if ties(o, out[best], model_error):
            out[i] = replace(o, transition=plan(o.plan))
        else:
            gain_s = (current_eff - effective_step_s(o.step_s, o.exposure_s, h)) * h
            what = (f"its gain over the horizon, dL*H = {gain_s:.2f} s" if not urgent
                    else f"its step*H = {o.step_s * h + o.exposure_s:.2f} s")
            out[i] = replace(o, skipped=f"not planned: {what}, cannot beat option {best} "
                                        f"({abs(best_score):.2f} s)")
    return tuple(out)
