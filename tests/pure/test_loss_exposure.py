"""Loss exposure (nereus.control.exposure): the expected checkpoint/restart seconds of a plan
once its pool has changed, weighed by admission with the steps; learnt from the job's own pool
while a plan runs, zero on a pool that never changed."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.staged_cases import SETUP

from nereus.config.job import parse_controller
from nereus.control.admission import (
    PlanOption,
    admit_opportunistic,
    admit_urgent,
    plan_lazily,
)
from nereus.control.controller import ControllerState, PlanEvaluation, controller_step
from nereus.control.exposure import (
    PoolHistory,
    exposure_s,
    restart_probability,
    stage_loss_probability,
)
from nereus.control.signals import Observation
from nereus.spec.job import ControllerSpec
from nereus.spec.plan import ExecutionPlan, StagePlan
from nereus.transition.fallbacks import checkpoint_restart_s, total_state_bytes
from nereus.transition.planned import PlannedTransition

NODE0, NODE1 = (0, 1, 2, 3), (4, 5, 6, 7)  # SETUP: 2 nodes of 4 GPUs


def _t(cost_s: float) -> PlannedTransition:
    return PlannedTransition.restart(cost_s, "test double: no DAG")


def test_history_learns_changes_while_a_plan_runs() -> None:
    h = PoolHistory()
    for pool in ((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3)):
        h = h.observed(pool)
    assert (h.steps, h.changes, h.rate_per_step, h.share) == (3, 0, 0.0, 0.0)
    assert h.shrink_within(100.0) == 0.0
    h = h.observed((0, 1))  # half the pool removed
    assert (h.steps, h.changes, h.share) == (4, 1, 0.5)
    assert h.rate_per_step == pytest.approx(1 / 8)  # half the changes are taken as shrinks
    h = h.observed((0, 1, 2, 3, 4, 5, 6, 7))  # grew: 6 of the larger pool's 8 moved
    assert h.changes == 2 and h.share == pytest.approx((0.5 + 0.75) / 2)
    assert h.shrink_within(2.0) == pytest.approx(1 - (1 - 2 / 10) ** 2)
    assert PoolHistory.from_dict(h.to_dict()) == h


def test_a_stage_is_lost_when_every_distinct_node_set_of_its_replicas_is_hit() -> None:
    one_node = tuple((g,) for g in NODE1)  # 4 replicas, one node: they fall together
    two_nodes = ((0,), (4,))
    across = ((0, 4),)  # one replica over both nodes: either node takes it
    assert stage_loss_probability(SETUP, one_node, 0.5) == pytest.approx(0.5)
    assert stage_loss_probability(SETUP, two_nodes, 0.5) == pytest.approx(0.25)
    assert stage_loss_probability(SETUP, across, 0.5) == pytest.approx(0.75)
    assert stage_loss_probability(SETUP, two_nodes, 0.0) == 0.0


def test_a_copy_counts_only_through_its_source() -> None:
    gen_on_1 = StagePlan("actor-gen", 1, 1, 4, 1, 2, replicas=tuple((g,) for g in NODE1))
    train_spread = StagePlan("actor-train", 1, 4, 2, 1, 4, replicas=(NODE0, NODE1))
    plan = ExecutionPlan((gen_on_1, train_spread))
    # a lost actor-gen is rebuilt from actor-train after the DAG (nereus.transition.rebuild):
    # only actor-train's loss (both nodes, 0.25) restarts, whatever the host memory
    assert restart_probability(SETUP, plan, 0.5) == pytest.approx(0.25)
    small = replace(SETUP, cluster=replace(SETUP.cluster, gpu=replace(
        SETUP.cluster.gpu, host_memory_bytes=1)))
    assert restart_probability(small, plan, 0.5) == pytest.approx(0.25)
    gen_spread = replace(gen_on_1, replicas=((0,), (1,), (4,), (5,)))
    train_on_1 = replace(train_spread, dp=1, replicas=(NODE1,))
    # a trained model-stage on one node: its loss restarts the job (its copy cannot help)
    assert restart_probability(SETUP, ExecutionPlan((gen_spread, train_on_1)), 0.5) \
        == pytest.approx(0.5)


def test_exposure_is_zero_until_the_pool_changes_and_grows_with_the_horizon() -> None:
    plan = ExecutionPlan((StagePlan("actor-train", 1, 4, 1, 1, 8, replicas=(NODE1,)),))
    still = PoolHistory().observed(NODE0 + NODE1).observed(NODE0 + NODE1)
    assert exposure_s(SETUP, plan, still, 10.0) == 0.0
    moved = still.observed(NODE0)
    short, long = exposure_s(SETUP, plan, moved, 1.0), exposure_s(SETUP, plan, moved, 10.0)
    assert 0.0 < short < long < checkpoint_restart_s(SETUP)
    assert short == pytest.approx(moved.shrink_within(1.0) * 0.5 * checkpoint_restart_s(SETUP))


def test_admission_weighs_exposure_with_the_steps() -> None:
    packed = ExecutionPlan((StagePlan("actor-train", 1, 1, 4, 1, 2,
                                      replicas=tuple((g,) for g in NODE1)),))
    spread = ExecutionPlan((StagePlan("actor-train", 1, 1, 4, 1, 2,
                                      replicas=((0,), (1,), (4,), (5,))),))
    fast = PlanOption(packed, 9.0, _t(1.0), exposure_s=40.0)
    safe = PlanOption(spread, 9.5, _t(1.0), exposure_s=5.0)
    # without exposure the faster target wins; with it over H = 10 steps, the safer one
    bare = admit_opportunistic(10.0, (replace(fast, exposure_s=0.0),
                                      replace(safe, exposure_s=0.0)), 0.5, 10.0)
    assert bare.target == packed
    adm = admit_opportunistic(10.0, (fast, safe), 0.5, 10.0, current_exposure_s=20.0)
    assert adm.target == spread and "exposure 5.00 s" in adm.reason
    assert [o.exposure_s for o in adm.options] == [40.0, 5.0]
    assert adm.current_exposure_s == 20.0
    # a target no faster than the current plan but far safer is worth its transition
    calm = admit_opportunistic(9.5, (safe,), 0.5, 10.0, current_exposure_s=60.0)
    assert calm.admitted and calm.target == spread
    # urgent: least step*H + exposure + L_tran
    urg = admit_urgent((fast, safe), 10.0)
    assert urg.target == spread and "exposure" in urg.reason


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(1.0, 20.0), st.floats(0.0, 30.0), st.floats(0.0, 50.0)),
                min_size=1, max_size=5),
       st.floats(1.0, 25.0), st.floats(0.0, 50.0), st.sampled_from([0.5, 1.0, 2.0, 7.5]),
       st.sampled_from([0.0, 0.05]), st.booleans())
def test_lazy_planning_with_exposures_admits_what_planning_every_option_admits(
        opts: list[tuple[float, float, float]], current: float, current_exp: float,
        horizon: float, eps: float, urgent: bool) -> None:
    def plan_of(k: int) -> ExecutionPlan:
        return ExecutionPlan((StagePlan("actor-train", 1, 1, k + 1, 1, 1,
                                        replicas=tuple((g,) for g in range(k + 1))),))

    rows = sorted(opts)
    plans = [plan_of(k) for k in range(len(rows))]
    cost = {p: c for p, (_, c, _) in zip(plans, rows, strict=True)}
    bare = tuple(PlanOption(p, s, None, exposure_s=x)
                 for p, (s, _, x) in zip(plans, rows, strict=True))
    eager = tuple(replace(o, transition=_t(cost[o.plan])) for o in bare)
    lazy = plan_lazily(bare, lambda p: _t(cost[p]), urgent=urgent, current_step_s=current,
                       gamma=0.5, horizon_steps=horizon, model_error=eps,
                       current_exposure_s=0.0 if urgent else current_exp)
    if urgent:
        a, b = admit_urgent(eager, horizon, eps), admit_urgent(lazy, horizon, eps)
    else:
        a = admit_opportunistic(current, eager, 0.5, horizon, eps, current_exp)
        b = admit_opportunistic(current, lazy, 0.5, horizon, eps, current_exp)
    assert (a.admitted, a.target, a.path) == (b.admitted, b.target, b.path)


class _Port:
    """Two plans on the SETUP cluster: ``packed`` (faster, every replica on node 1) and
    ``spread``; exposure from the real model; transitions of 1 s."""

    def __init__(self, packed: ExecutionPlan, spread: ExecutionPlan) -> None:
        self.packed, self.spread = packed, spread
        self.exposure_calls = 0

    def evaluate(self, plan: ExecutionPlan, obs: Observation) -> PlanEvaluation:
        return PlanEvaluation({self.packed: 9.0, self.spread: 9.5}.get(plan, 12.0), True)

    def options(self, obs: Observation, current: ExecutionPlan | None
                ) -> list[tuple[ExecutionPlan, float]]:
        return [(self.packed, 9.0), (self.spread, 9.5)]

    def transition(self, current: ExecutionPlan, target: ExecutionPlan) -> PlannedTransition:
        return _t(1.0)

    def exposure(self, plan: ExecutionPlan, history: PoolHistory, horizon: float) -> float:
        self.exposure_calls += 1
        return exposure_s(SETUP, plan, history, horizon)


def test_the_controller_consults_exposure_only_after_the_pool_changed_under_a_plan() -> None:
    start = ExecutionPlan((StagePlan("actor-train", 1, 1, 2, 1, 4, replicas=((0,), (1,))),))
    packed = ExecutionPlan((StagePlan("actor-train", 1, 1, 4, 1, 2,
                                      replicas=tuple((g,) for g in NODE1)),))
    spread = ExecutionPlan((StagePlan("actor-train", 1, 1, 4, 1, 2,
                                      replicas=((0,), (1,), (4,), (5,))),))
    both = NODE0 + NODE1
    port = _Port(packed, spread)
    spec = ControllerSpec()
    # a wait for a first feasible pool is no change of a running job's pool
    st0 = ControllerState(plan=None).pool_history.observed((0, 1))
    state, _ = controller_step(ControllerState(pool_history=st0), Observation(0, 8, 8, both),
                               spec, port)
    assert state.pool_history.changes == 0
    # a running plan on a pool that never changed: no exposure, the faster target wins
    state = replace(state, plan=start)
    state, d = controller_step(state, Observation(1, 20, 20, both), spec, port)
    assert port.exposure_calls == 0 and d.admission is not None
    assert d.admission.target == packed
    # the pool shrank and came back under the running plan: exposure picks the spread target
    state = replace(state, plan=start)
    state, _ = controller_step(state, Observation(2, 20, 20, NODE0), spec, port)
    state = replace(state, plan=start, pool=NODE0)
    state, d = controller_step(state, Observation(3, 20, 20, both), spec, port)
    assert state.pool_history.changes == 2 and port.exposure_calls > 0
    assert d.admission is not None and d.admission.target == spread
    assert all(o.exposure_s > 0 for o in d.admission.options)
    # and with controller.loss_exposure false the faster one again
    off = parse_controller({"loss_exposure": False})
    state2, d2 = controller_step(replace(state, plan=start, pool=NODE0),
                                 Observation(4, 20, 20, both), off, port)
    assert d2.admission is not None and d2.admission.target == packed
    assert ControllerState.from_dict(state2.to_dict()) == state2
    old = {k: v for k, v in state2.to_dict().items() if k != "pool_history"}
    assert ControllerState.from_dict(old).pool_history == PoolHistory()  # older checkpoints


def test_a_spot_trace_shrink_is_survived_with_exposure_and_restarts_without() -> None:
    """Llama-3.1-8B PPO on 32 A100-64GB, AWS spot trace us-east-2b, the paper's 25 lengths:
    without exposure the plan chosen when the pool grew at step 7 holds every replica of a
    model-stage on the nodes the shrink at step 15 takes (a checkpoint/restart, 229 s); with
    it the controller chose a plan that survives the shrink by a transition."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import policies

    sc = next(s for s in policies.scenarios(["8b-a100"], True)
              if s.trace == "spot/us-east-2b_v100_1")
    on, off = policies.run(sc, "nereus"), policies.run(sc, "nereus", loss_exposure=False)
    restarts = [sum(r.event == "restart" for r in res.records) for res in (on, off)]
    assert restarts[0] < restarts[1]
    assert on.mean_step_s < off.mean_step_s
    # the whole state exceeds a rank's host memory: a lost frozen copy restarts the job too
    setup = sc.setup()
    assert total_state_bytes(setup) > setup.cluster.gpu.host_memory_bytes
