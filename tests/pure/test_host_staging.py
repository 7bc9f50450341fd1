"""Issue 32: targets whose plain DAG exceeds device memory are reached through host memory; every
plan change is priced (DAG, host-staged DAG, gather-and-reload, checkpoint/restart); admission
weighs several targets by payback value, with the tie rule; every option is logged."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.staged_cases import (
    CAPACITY,
    CURRENT,
    ISSUE_CURRENT,
    ISSUE_SETUP,
    ISSUE_TARGET,
    ROOMY,
    SETUP,
    TARGET,
    TRAIN_BYTES,
)

from nereus.config.job import parse_controller
from nereus.control.admission import PlanOption, admit_opportunistic, admit_urgent
from nereus.control.controller import ControllerState, PlanEvaluation, controller_step
from nereus.control.signals import Observation
from nereus.errors import ConfigError, TransitionError
from nereus.spec.job import ControllerSpec, Setup
from nereus.spec.plan import ExecutionPlan
from nereus.transition.change import plan_change
from nereus.transition.order import PlanChangeOrder
from nereus.transition.planned import PlannedTransition, plan_transition
from nereus.transition.schedule import Scheduler, SimulatedExecutor, drive
from nereus.transition.staged import plan_staged, staged_device_peaks


def _plain_peak(setup: Setup, current: ExecutionPlan, target: ExecutionPlan) -> int:
    """The highest bytes on any GPU while the plain DAG (compiled with room) runs."""
    dag = plan_transition(setup, current, target).dag
    sched = Scheduler(dag)
    peak = 0

    class Rec(SimulatedExecutor):
        def start(self, index: int, primitive: object) -> None:
            nonlocal peak
            super().start(index, primitive)  # type: ignore[arg-type]
            peak = max(peak, *sched.bytes_now.values())

    drive(sched, Rec([1.0] * len(dag.primitives)))
    return peak


def test_issue_case_is_staged_and_fits_where_the_plain_dag_does_not() -> None:
    cap = ISSUE_SETUP.cluster.gpu.memory_bytes
    with pytest.raises(TransitionError, match=r"actor-train 84320538624.*> capacity 64000000000"):
        plan_transition(ISSUE_SETUP, ISSUE_CURRENT, ISSUE_TARGET)
    planned = plan_change(ISSUE_SETUP, ISSUE_CURRENT, ISSUE_TARGET)
    assert planned.executor == "staged" and planned.staged is not None
    assert "actor-train" in planned.staged.names
    peaks = staged_device_peaks(planned, cap)
    assert max(peaks.values()) <= cap  # every leg, the DAG's under the scheduler
    host = dict(planned.staged.host_bytes)
    assert all(b <= ISSUE_SETUP.cluster.gpu_of(g).host_memory_bytes for g, b in host.items())
    # priced: offload at the host link, reload over the host transport, the rest's DAG
    st = planned.staged
    assert planned.cost_s >= st.offload_s + st.reload_s + st.rest.cost_s > 0
    assert st.offload_s == pytest.approx(max(host.values()) / 25e9)


def test_small_case_plain_dag_is_over_memory_in_every_order_and_staged_fits() -> None:
    with pytest.raises(TransitionError, match="> capacity"):
        plan_transition(SETUP, CURRENT, TARGET)
    assert _plain_peak(ROOMY, CURRENT, TARGET) > CAPACITY  # the order it runs in with room
    planned = plan_change(SETUP, CURRENT, TARGET)
    assert planned.executor == "staged"
    assert max(staged_device_peaks(planned, CAPACITY).values()) <= CAPACITY


def test_host_memory_bounds_staging() -> None:
    tight = replace(SETUP, cluster=replace(SETUP.cluster, gpu=replace(
        SETUP.cluster.gpu, host_memory_bytes=TRAIN_BYTES // 8)))
    with pytest.raises(TransitionError, match="pinned host memory"):
        plan_staged(tight, CURRENT, TARGET, reason="the DAG does not fit")
    planned = plan_change(tight, CURRENT, TARGET)  # gather-and-reload needs more host memory
    assert planned.executor == "restart" and "host memory" in planned.restart_reason


@dataclass
class PlanPort:
    """Two plans with fixed predictions; transitions planned for real (:func:`plan_change`)."""

    setup: Setup
    latency: dict[ExecutionPlan, float]
    staging: bool = True

    def evaluate(self, plan: ExecutionPlan, obs: Observation) -> PlanEvaluation:
        return PlanEvaluation(self.latency[plan], True)

    def options(self, obs: Observation, current: ExecutionPlan | None
                ) -> Sequence[tuple[ExecutionPlan, float]]:
        return sorted(self.latency.items(), key=lambda kv: kv[1])

    def transition(self, current: ExecutionPlan, target: ExecutionPlan
                   ) -> PlannedTransition | None:
        if current == target:
            return PlannedTransition(0.0)
        return plan_change(self.setup, current, target, staging=self.staging)


def _obs(step: int, gen_len: float) -> Observation:
    return Observation(step, gen_len, gen_len, tuple(range(8)))


def test_controller_admits_the_staged_target_and_logs_every_option() -> None:
    spec = ControllerSpec()
    port = PlanPort(SETUP, {CURRENT: 10.0})
    st, _ = controller_step(ControllerState(), _obs(0, 100.0), spec, port)
    assert st.plan == CURRENT
    port.latency[TARGET] = 8.0  # the lengths grew: the target is 20% faster
    st, d = controller_step(st, _obs(1, 140.0), spec, port)
    adm = d.admission
    assert adm is not None and adm.admitted and adm.target == TARGET and st.plan == TARGET
    assert adm.transition is not None and adm.transition.executor == "staged"
    assert "(staged)" in adm.reason
    # every option considered is logged with its verdict
    assert [(o.label.count("actor-train=(2,2,2)"), o.admitted) for o in adm.options] == [
        (1, True), (0, False)]
    assert "not faster" in adm.options[1].reason and adm.options[0].executor == "staged"


def test_gather_and_reload_is_admitted_when_its_payback_holds_and_rejected_when_not() -> None:
    planned = plan_change(SETUP, CURRENT, TARGET, staging=False)  # no DAG fits, none staged
    assert planned.executor == "gather-reload" and "> capacity" in planned.restart_reason
    cost = planned.cost_s
    opts = (PlanOption(TARGET, 10.0 - cost, planned),)  # ΔL = L̂_tran: pays back in 1 step
    ok = admit_opportunistic(10.0, opts, gamma=0.5, horizon_steps=4.0)
    assert ok.admitted and ok.transition is planned and "(gather-reload)" in ok.reason
    no = admit_opportunistic(10.0, opts, gamma=0.5, horizon_steps=1.0)
    assert not no.admitted and "payback 1.00 steps > gamma*H = 0.50" in no.reason
    assert no.options[0].executor == "gather-reload" and not no.options[0].admitted
    # the controller takes the same way with host staging switched off
    spec = ControllerSpec(host_staging=False)
    port = PlanPort(SETUP, {CURRENT: 10.0}, staging=False)
    st, _ = controller_step(ControllerState(), _obs(0, 100.0), spec, port)
    port.latency[TARGET] = 10.0 - 100 * cost
    _, d = controller_step(st, _obs(1, 140.0), spec, port)
    assert d.admission is not None and d.admission.admitted
    assert d.admission.transition is not None
    assert d.admission.transition.executor == "gather-reload"


def _t(cost: float) -> PlannedTransition:
    return PlannedTransition.restart(cost, "test double")


def test_urgent_takes_least_time_over_the_horizon_not_the_fastest() -> None:
    fast = PlannedTransition.checkpoint_restart(229.0, "every replica lost")
    adm = admit_urgent((PlanOption(TARGET, 5.0, fast), PlanOption(CURRENT, 6.0, _t(1.0))),
                       horizon_steps=10.0)
    assert adm.admitted and adm.target == CURRENT and adm.path == "urgent"
    adm = admit_urgent((PlanOption(TARGET, 5.0, fast), PlanOption(CURRENT, 60.0, _t(1.0))),
                       horizon_steps=10.0)
    assert adm.target == TARGET and adm.path == "restart"  # the restart is still the least


def test_tie_rule_cheaper_transition_wins_within_the_model_error() -> None:
    a, b = PlanOption(TARGET, 9.0, _t(3.0)), PlanOption(CURRENT, 9.3, _t(0.5))
    # value: a 1.0*10 - 3 = 7.0 > b 0.7*10 - 0.5 = 6.5; 9.0 and 9.3 differ by 3.3%
    assert admit_opportunistic(10.0, (a, b), 0.5, 10.0, model_error=0.0).target == TARGET
    adm = admit_opportunistic(10.0, (a, b), 0.5, 10.0, model_error=0.05)
    assert adm.target == CURRENT and "within the model's error" in adm.reason
    assert "its transition costs more" in adm.options[0].reason


def test_staged_order_round_trips_its_wire_form() -> None:
    planned = plan_change(SETUP, CURRENT, TARGET)
    order = PlanChangeOrder.of(TARGET, tuple(range(8)), "opportunistic", planned, 1)
    assert order.dag is None and order.staged is planned.staged
    back = PlanChangeOrder.from_wire(order.to_wire())
    assert back.staged is not None and planned.staged is not None
    assert back.staged.stages == planned.staged.stages
    assert back.staged.rest.dag == planned.staged.rest.dag
    assert back.reason == planned.staged.reason and back.predicted_s == planned.cost_s


@pytest.mark.parametrize("key,value,rule", [
    ("model_error", 1.0, "must be a number in [0, 1)"),
    ("targets", 0, "must be a positive integer"),
    ("targets", 17, "must be at most 16"),
    ("host_staging", "yes", "must be true or false"),
])
def test_controller_knobs_are_checked(key: str, value: object, rule: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_controller({key: value})
    assert f"controller.{key}" in str(e.value) and rule in str(e.value)


def test_controller_knobs_parse() -> None:
    spec = parse_controller({"model_error": 0.1, "targets": 2, "host_staging": False})
    assert (spec.model_error, spec.targets, spec.host_staging) == (0.1, 2, False)


def test_candidate_targets_span_step_time_and_transition_cost() -> None:
    from nereus.control.planner_port import SearchPort
    from nereus.cost.calibration import default_calibration

    pool = tuple(range(32))
    port = SearchPort(ISSUE_SETUP, default_calibration(), pool=pool)
    obs = Observation(1, 3000.0, 3300.0, pool)
    opts = port.options(obs, ISSUE_CURRENT)
    assert 2 <= len(opts) <= ISSUE_SETUP.job.controller.targets
    assert [s for _, s in opts] == sorted(s for _, s in opts)
    assert len({p for p, _ in opts}) == len(opts)
    assert opts[0] == port.search(obs)  # S* first
    keep = {sp.name: (sp.tp, sp.pp) for sp in ISSUE_CURRENT.stages}
    assert any(all((sp.tp, sp.pp) == keep[sp.name] for sp in p.stages) for p, _ in opts)
    one = replace(ISSUE_SETUP, job=replace(ISSUE_SETUP.job, controller=ControllerSpec(targets=1)))
    assert len(SearchPort(one, default_calibration(), pool=pool).options(obs, ISSUE_CURRENT)) == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(1.0, 20.0), st.floats(0.0, 30.0)), min_size=1, max_size=5),
       st.floats(1.0, 25.0), st.sampled_from([0.5, 1.0, 2.0, 7.5]),
       st.sampled_from([0.0, 0.05]), st.booleans())
def test_lazy_planning_admits_what_planning_every_option_admits(
        opts: list[tuple[float, float]], current: float, horizon: float, eps: float,
        urgent: bool) -> None:
    from nereus.control.admission import plan_lazily
    from nereus.spec.plan import StagePlan

    def plan_of(k: int) -> ExecutionPlan:
        return ExecutionPlan((StagePlan("actor-train", 1, 1, k + 1, 1, 1,
                                        replicas=tuple((g,) for g in range(k + 1))),))

    rows = sorted(opts)
    plans = [plan_of(k) for k in range(len(rows))]
    cost = {p: c for p, (_, c) in zip(plans, rows, strict=True)}
    bare = tuple(PlanOption(p, s, None) for p, (s, _) in zip(plans, rows, strict=True))
    eager = tuple(replace(o, transition=_t(cost[o.plan])) for o in bare)
    calls: list[ExecutionPlan] = []

    def planner(p: ExecutionPlan) -> PlannedTransition:
        calls.append(p)
        return _t(cost[p])

    lazy = plan_lazily(bare, planner, urgent=urgent, current_step_s=current, gamma=0.5,
                       horizon_steps=horizon, model_error=eps)
    if urgent:
        a, b = admit_urgent(eager, horizon, eps), admit_urgent(lazy, horizon, eps)
    else:
        a = admit_opportunistic(current, eager, 0.5, horizon, eps)
        b = admit_opportunistic(current, lazy, 0.5, horizon, eps)
    assert (a.admitted, a.target, a.path) == (b.admitted, b.target, b.path)
    assert len(calls) == len(set(calls)) <= len(bare)
    assert all(o.skipped.startswith("not planned") for o in lazy if o.skipped)


def test_urgent_after_a_refused_allocation_never_keeps_the_current_plan() -> None:
    # The memory model still finds the current plan feasible and the search offers it (cheapest
    # over the horizon: no transition); a device refused an allocation, so it cannot go on.
    spec = ControllerSpec()
    port = PlanPort(SETUP, {CURRENT: 10.0})
    st, _ = controller_step(ControllerState(), _obs(0, 100.0), spec, port)
    port.latency[TARGET] = 10.5
    oom = replace(_obs(1, 100.0), memory_violation=True)
    _, d = controller_step(st, oom, spec, port)
    adm = d.admission
    assert d.urgent and adm is not None and adm.admitted and adm.target == TARGET
    assert [o.step_s for o in adm.options] == [10.5]  # the current plan is no option
    # with nothing else on offer the current plan is still the answer (as before)
    port2 = PlanPort(SETUP, {CURRENT: 10.0})
    st2, _ = controller_step(ControllerState(), _obs(0, 100.0), spec, port2)
    _, d2 = controller_step(st2, oom, spec, port2)
    assert d2.admission is not None and d2.admission.target == CURRENT
