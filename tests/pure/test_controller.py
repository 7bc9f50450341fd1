"""Tier 1 (pure): every rule of DESIGN.md §2.1 in the controller state machine.

The planner port here is a table of plans and latencies: the controller's rules are under test,
not the planner (which has its own tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from nereus.control.admission import PlanOption, admit_opportunistic, payback_ok
from nereus.control.controller import (
    ControllerState,
    PlanEvaluation,
    controller_step,
)
from nereus.control.horizon import SignalHorizon
from nereus.control.signals import GEN_LEN, MEMORY, POOL, Observation
from nereus.spec.job import ControllerSpec
from nereus.spec.plan import ExecutionPlan, StagePlan
from nereus.transition.planned import PlannedTransition


def plan_on(gpus: tuple[int, ...], tp: int = 1) -> ExecutionPlan:
    reps = tuple(gpus[i : i + tp] for i in range(0, len(gpus), tp))
    return ExecutionPlan((StagePlan("actor-train", tp, 1, len(reps), 1, 1, replicas=reps),))


@dataclass
class TablePort:
    """Plans offered fastest first; latencies keyed by plan; a memory limit on gen_len."""

    offers: list[tuple[ExecutionPlan, float]]
    latency: dict[ExecutionPlan, float]
    costs: dict[ExecutionPlan, float | None] = field(default_factory=dict)
    max_gen_len: float = 1e9
    calls: int = 0

    def evaluate(self, plan: ExecutionPlan, obs: Observation) -> PlanEvaluation:
        ok = obs.gen_len_mean <= self.max_gen_len
        return PlanEvaluation(self.latency[plan], ok, "" if ok else "OOM")

    def options(
        self, obs: Observation, current: ExecutionPlan | None
    ) -> Sequence[tuple[ExecutionPlan, float]]:
        self.calls += 1
        return [o for o in self.offers if all(g in obs.pool for g in _gpus(o[0]))]

    def transition(self, current: ExecutionPlan, target: ExecutionPlan
                   ) -> PlannedTransition | None:
        cost = self.costs.get(target, 1.0)
        return None if cost is None else planned(cost)


def planned(cost_s: float) -> PlannedTransition:
    """A planned transition of L̂_tran ``cost_s`` (its DAG does not matter to admission)."""
    return PlannedTransition.restart(cost_s, "test double: no DAG")


def _gpus(plan: ExecutionPlan) -> set[int]:
    return {g for sp in plan.stages for g in sp.gpus}


POOL8 = tuple(range(8))
A = plan_on(POOL8, tp=1)
B = plan_on(POOL8, tp=2)
C = plan_on(tuple(range(4)), tp=1)
SPEC = ControllerSpec()


def obs(step: int, gen_len: float = 1000.0, pool: tuple[int, ...] = POOL8, **kw) -> Observation:
    return Observation(step, gen_len, gen_len * 1.2, pool, **kw)


def started(port: TablePort) -> ControllerState:
    st, d = controller_step(ControllerState(), obs(0), SPEC, port)
    assert d.admission is not None and d.admission.path == "initial"
    return st


def test_initial_plan_is_the_fastest_option() -> None:
    port = TablePort([(A, 10.0)], {A: 10.0})
    st = started(port)
    assert st.plan == A and st.transitions == 0


def test_no_trigger_within_threshold() -> None:
    port = TablePort([(A, 10.0), (B, 5.0)], {A: 10.0, B: 5.0})
    st = started(port)
    st2, d = controller_step(st, obs(1, gen_len=1299.0), SPEC, port)  # +29.9% < 30%
    assert d.triggers == () and not d.replanned and port.calls == 1 and st2.plan == A


def test_length_drift_triggers_and_references_reset_on_rejection() -> None:
    port = TablePort([(B, 9.9), (A, 10.0)], {A: 10.0, B: 9.9}, {B: 100.0})
    st = started(port)
    st2, d = controller_step(st, obs(1, gen_len=1301.0), SPEC, port)
    assert d.triggers == (GEN_LEN,) and d.replanned
    assert d.admission is not None and not d.admission.admitted  # 100 s / 0.1 s ≫ γ·H
    assert dict(st2.references)[GEN_LEN] == 1301.0  # reset although rejected
    _st3, d3 = controller_step(st2, obs(2, gen_len=1301.0 * 1.2), SPEC, port)
    assert d3.triggers == ()  # measured against the new reference: +20%


def test_efficiency_drift_triggers() -> None:
    port = TablePort([(A, 10.0)], {A: 10.0})
    st = started(port)
    st, _ = controller_step(st, obs(1, efficiencies=(("gemm", 0.6),)), SPEC, port)
    _, d = controller_step(st, obs(2, efficiencies=(("gemm", 0.4),)), SPEC, port)
    assert d.triggers == ("eff:gemm",)


def test_pool_change_triggers_at_once_and_lost_gpus_are_urgent() -> None:
    port = TablePort([(A, 10.0), (C, 14.0)], {A: 10.0, C: 14.0}, {C: 1e6})
    st = started(port)
    st2, d = controller_step(st, obs(1, pool=tuple(range(4))), SPEC, port)
    assert d.triggers[0] == POOL and d.urgent and d.lost_gpus == (4, 5, 6, 7)
    assert d.admission is not None and d.admission.path == "urgent" and d.admission.admitted
    assert st2.plan == C  # profitability waived: the transition costs 1e6 s


def test_gained_gpus_take_the_opportunistic_path() -> None:
    port = TablePort([(A, 10.0), (C, 14.0)], {A: 10.0, C: 14.0})
    st, _ = controller_step(ControllerState(), obs(0, pool=tuple(range(4))), SPEC, port)
    assert st.plan == C
    st2, d = controller_step(st, obs(1), SPEC, port)
    assert d.triggers == (POOL,) and not d.urgent
    # ΔL = 4 s, L_tran = 1 s → 0.25 steps ≤ γ·H = 0.5·1: admitted.
    assert d.admission is not None and d.admission.admitted and st2.plan == A


def test_predicted_oom_is_urgent() -> None:
    port = TablePort([(B, 12.0)], {A: 10.0, B: 12.0}, {B: 50.0}, max_gen_len=1100.0)
    st = TablePort([(A, 10.0)], {A: 10.0})
    s0 = started(st)
    s1, d = controller_step(s0, obs(1, gen_len=1200.0), SPEC, port)
    assert MEMORY in d.triggers and d.urgent
    assert d.admission is not None and d.admission.path == "urgent" and s1.plan == B


def test_urgent_without_executable_transition_falls_back_to_restart() -> None:
    port = TablePort([(B, 12.0)], {A: 10.0, B: 12.0}, {B: None}, max_gen_len=1100.0)
    s0 = started(TablePort([(A, 10.0)], {A: 10.0}))
    _, d = controller_step(s0, obs(1, gen_len=1200.0), SPEC, port)
    assert d.admission is not None and d.admission.path == "restart" and d.admission.target == B


def test_fallback_to_slower_target_with_cheaper_transition() -> None:
    fast, slower = B, C
    opts = (PlanOption(fast, 5.0, None), PlanOption(slower, 6.0, planned(0.5)))
    adm = admit_opportunistic(10.0, opts, gamma=0.5, horizon_steps=1.0)
    assert adm.admitted and adm.target == slower and "fallback" in adm.reason
    opts = (PlanOption(fast, 5.0, planned(100.0)), PlanOption(slower, 6.0, planned(1.0)))
    adm = admit_opportunistic(10.0, opts, gamma=0.5, horizon_steps=1.0)
    assert adm.admitted and adm.target == slower


def test_gamma_zero_admits_only_urgent() -> None:
    assert not payback_ok(5.0, 0.0, 0.0, 100.0)
    spec = ControllerSpec(gamma=0.0)
    port = TablePort([(A, 10.0), (C, 14.0)], {A: 10.0, C: 14.0}, {C: 1e6})
    st, _ = controller_step(ControllerState(), obs(0, pool=tuple(range(4))), spec, port)
    _, d = controller_step(st, obs(1), spec, port)
    assert d.admission is not None and not d.admission.admitted
    _, d = controller_step(started(port), obs(1, pool=tuple(range(4))), spec, port)
    assert d.admission is not None and d.admission.admitted and d.urgent


def test_horizon_updates_only_at_crossings_and_smallest_is_used() -> None:
    h = SignalHorizon()
    assert h.horizon_steps == 1.0
    h = h.crossed(3, alpha=0.5)
    assert h.horizon_steps == 1.0 and h.intervals_seen == 0  # no interval yet
    h = h.crossed(13, alpha=0.5)
    assert h.horizon_steps == 10.0
    h = h.crossed(17, alpha=0.5)
    assert h.horizon_steps == 7.0  # 0.5·4 + 0.5·10

    port = TablePort([(B, 9.0), (A, 10.0)], {A: 10.0, B: 9.0}, {B: 4.0})
    st = started(TablePort([(A, 10.0)], {A: 10.0}))
    lengths = [1000, 1400, 1400, 1400, 1400, 1400, 1400, 1400, 1400, 1400, 1400, 1900]
    decisions = []
    for step, gl in enumerate(lengths, start=1):
        st, d = controller_step(st, obs(step, gen_len=gl), SPEC, port)
        decisions.append(d)
    assert st.horizon(GEN_LEN).horizon_steps == 10.0  # crossings at steps 2 and 12
    assert all(d.triggers == () for d in decisions[2:10])  # no update between crossings
    # At step 12: ΔL = 1 s, L_tran = 4 s → 4 steps ≤ 0.5 · 10: admitted.
    last = decisions[-1].admission
    assert last is not None and last.admitted and last.horizon_steps == 10.0
    # Both pool and length cross at once: the smaller horizon (pool: 1 step, unseen) is used.
    st, d = controller_step(st, obs(13, gen_len=3000, pool=(*POOL8, 8)), SPEC, port)
    assert set(d.triggers) == {POOL, GEN_LEN}
    assert d.admission is not None and d.admission.horizon_steps == 1.0


def test_replan_waits_for_a_running_transition_unless_gpus_are_lost() -> None:
    port = TablePort([(B, 5.0), (A, 10.0), (C, 14.0)], {A: 10.0, B: 5.0, C: 14.0})
    st = started(TablePort([(A, 10.0)], {A: 10.0}))
    st2, d = controller_step(st, obs(1, gen_len=2000, transition_running=True), SPEC, port)
    assert d.deferred and not d.replanned and st2.pending == (GEN_LEN,)
    st3, d = controller_step(st2, obs(2, gen_len=2000), SPEC, port)
    assert d.replanned and GEN_LEN in d.triggers and st3.pending == ()
    _, d = controller_step(st, obs(1, pool=tuple(range(4)), transition_running=True), SPEC, port)
    assert d.replanned and d.urgent


def test_state_round_trips_and_is_deterministic() -> None:
    def run() -> tuple[ControllerState, list]:
        port = TablePort([(B, 9.0), (A, 10.0), (C, 14.0)], {A: 10.0, B: 9.0, C: 14.0})
        st = ControllerState()
        out = []
        for step, (gl, pool) in enumerate([(1000, POOL8), (1500, POOL8), (1500, (0, 1, 2, 3))]):
            st, d = controller_step(st, obs(step, gen_len=gl, pool=pool), SPEC, port)
            out.append(d)
        return st, out

    a, da = run()
    b, db = run()
    assert a == b and da == db
    assert ControllerState.from_dict(a.to_dict()) == a


def test_urgent_prefers_a_target_with_a_dag_over_a_faster_one_without() -> None:
    """A node loss where S* reshapes a model-stage that no DAG can reach (the port plans the
    in-process gather and reload for it) and a slightly slower target keeps the units: the
    urgent path takes the DAG, since urgent admission prices each target's time over the
    horizon, step·H + L̂_tran (issue 37's DAG preference, kept under issue 32's rule); only a
    horizon long enough for S*'s gain to pay its reload back takes S*; with no DAG anywhere,
    the least time over the horizon."""
    from nereus.control.admission import admit_urgent
    from nereus.transition.dag import TransitionDag

    dag = PlannedTransition(0.2, reference=TransitionDag((), (), (), (), ()))
    adm = admit_urgent((PlanOption(B, 5.0, planned(60.0)), PlanOption(C, 5.1, dag)))
    assert adm.admitted and adm.path == "urgent" and adm.target == C
    assert adm.transition is not None and adm.transition.executor == "dag"
    adm = admit_urgent((PlanOption(B, 5.0, planned(60.0)), PlanOption(C, 5.1, dag)), 100.0)
    assert adm.target == C  # 5.1·100 + 0.2 < 5.0·100 + 60
    adm = admit_urgent((PlanOption(B, 5.0, planned(60.0)), PlanOption(C, 5.1, dag)), 1000.0)
    assert adm.target == B and adm.path == "urgent"  # 0.1 s × 1,000 steps pays the 60 s back
    assert adm.transition is not None and adm.transition.executor == "gather-reload"
    adm = admit_urgent((PlanOption(B, 5.0, planned(60.0)), PlanOption(C, 5.1, planned(50.0))))
    assert adm.target == C  # no DAG anywhere: 5.1 + 50 < 5.0 + 60
