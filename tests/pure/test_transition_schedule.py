"""Tier 1 (pure): transition cost, the scheduler core, the simulator and the per-component
baseline (the exact scheduler: tests/pure/test_transition_exact.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.transition_cases import random_case

from nereus.emu.primitives import Destroy, Extend
from nereus.emu.unit import Emu, Layout, emus_of_plan
from nereus.errors import TransitionError
from nereus.spec.hardware import H200, ClusterSpec
from nereus.transition.baselines import per_component_simulate
from nereus.transition.cost import critical_path_s, durations_s, primitive_duration_s
from nereus.transition.reference.compile import compile_plans, compile_transition
from nereus.transition.schedule import Scheduler, SimulatedExecutor, drive, simulate

CLUSTER = ClusterSpec(2, 4, H200)


def _crossing() -> tuple[list[Emu], list[Emu]]:
    """a and b each release one GPU the other's new replica needs."""
    src = [Emu("a-inf", "a", Layout(1, 1), (0,)), Emu("a-inf", "a", Layout(1, 1), (1,)),
           Emu("b-inf", "b", Layout(1, 1), (2,)), Emu("b-inf", "b", Layout(1, 1), (3,))]
    tgt = [Emu("a-inf", "a", Layout(1, 1), (0,)), Emu("a-inf", "a", Layout(1, 1), (2,)),
           Emu("b-inf", "b", Layout(1, 1), (3,)), Emu("b-inf", "b", Layout(1, 1), (1,))]
    return src, tgt


def test_extend_duration_uses_the_link_it_crosses() -> None:
    sb = 8 * 10**9
    intra = Extend(Emu("a-inf", "a", Layout(1, 1), (0,)), Emu("a-inf", "a", Layout(1, 1), (1,)), sb)
    inter = Extend(Emu("a-inf", "a", Layout(1, 1), (0,)), Emu("a-inf", "a", Layout(1, 1), (4,)), sb)
    setup = H200.comm_setup_s
    assert primitive_duration_s(intra, CLUSTER) == pytest.approx(setup + sb / 450e9)
    assert primitive_duration_s(inter, CLUSTER) == pytest.approx(setup + sb / 50e9)
    assert primitive_duration_s(Destroy(intra.src, sb), CLUSTER) == 0.0


def test_disjoint_groups_run_concurrently_and_acquisition_waits_for_release() -> None:
    src, tgt = _crossing()
    dag = compile_transition(src, tgt, lambda m: 10**9)
    assert len(dag.resource_edges) == 2
    sched = Scheduler(dag)
    first = sched.ready()
    assert all(isinstance(dag.primitives[i], Destroy) for i in first) and len(first) == 2
    # Without the resource edges the scheduler itself still refuses an Extend onto held GPUs.
    loose = Scheduler(dag.without(("resource",)))
    for i in loose.ready():
        p = loose.dag.primitives[i]
        assert not isinstance(p, Extend) or not any(g in loose.owner for g in p.acquires)
    res = simulate(dag, durations_s(dag, CLUSTER))
    ext = [i for i, p in enumerate(dag.primitives) if isinstance(p, Extend)]
    assert res.start_s[ext[0]] == res.start_s[ext[1]]  # the two Extends overlap in time
    assert res.makespan_s == pytest.approx(critical_path_s(dag, durations_s(dag, CLUSTER)))


class _FifoExecutor:
    """Completes primitives one at a time in start order (like a single slow stream)."""

    def __init__(self) -> None:
        self.started: list[int] = []

    def start(self, index: int, primitive: object) -> None:
        self.started.append(index)

    def wait(self) -> list[int]:
        return [self.started.pop(0)]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**9))
def test_same_core_drives_any_executor_in_a_valid_order(seed: int) -> None:
    case = random_case(seed)
    if case is None:
        return
    dag, _sizer = case
    order = drive(Scheduler(dag), _FifoExecutor())
    done: set[int] = set()
    for i in order:
        assert set(dag.preds[i]) <= done
        done.add(i)
    dur = durations_s(dag, CLUSTER8)
    sim = simulate(dag, dur)
    cp = critical_path_s(dag, dur)
    assert cp - 1e-9 <= sim.makespan_s <= sum(dur) + 1e-9
    # a random late launch never breaks the schedule
    rng = random.Random(seed)
    gate = [rng.uniform(0, 1) for _ in dag.primitives]
    assert simulate(dag, dur, not_before_s=gate).makespan_s >= sim.makespan_s - 1e-9


CLUSTER8 = ClusterSpec(4, 8, H200)


def test_per_component_deadlocks_sometimes_ours_never() -> None:
    src, tgt = _crossing()
    dag = compile_transition(src, tgt, lambda m: 10**9)
    dur = durations_s(dag, CLUSTER)
    outcomes = []
    for seed in range(40):
        rng = random.Random(seed)
        launch = {"a-inf": rng.uniform(0, 1), "b-inf": rng.uniform(0, 1)}
        outcomes.append(per_component_simulate(dag, dur, launch_s=launch, timeout_s=30.0,
                                               rng=rng))
        gate = [launch[p.model_stage] for p in dag.primitives]
        assert simulate(dag, dur, not_before_s=gate).makespan_s < 30.0
    assert any(o.success for o in outcomes)
    failed = [o for o in outcomes if not o.success]
    assert failed and all(o.time_s == 30.0 and "deadlock" in o.reason for o in failed)


def test_scheduler_rejects_a_start_that_is_not_ready() -> None:
    src, tgt = _crossing()
    dag = compile_transition(src, tgt, lambda m: 10)
    sched = Scheduler(dag)
    ext = next(i for i, p in enumerate(dag.primitives) if isinstance(p, Extend))
    with pytest.raises(TransitionError):
        sched.start(ext)


def test_plans_compile_through_the_plan_api() -> None:
    from nereus.spec.plan import ExecutionPlan, StagePlan

    cur = ExecutionPlan((StagePlan("actor-gen", 2, 1, 2, 1, 1, replicas=((0, 1), (2, 3))),))
    tgt = ExecutionPlan((StagePlan("actor-gen", 1, 1, 4, 1, 1, replicas=((0,), (1,), (2,), (3,))),))
    dag = compile_plans(cur, tgt, {"actor-gen": "actor"}, lambda m: 10**9)
    assert dag.counts() == {"Split": 2}
    assert set(emus_of_plan(tgt, {"actor-gen": "actor"})) == set(dag.target)


def test_scheduler_holds_a_split_whose_buffers_do_not_fit() -> None:
    src = [Emu("a-gen", "a", Layout(2, 1), (0, 1))]
    tgt = [Emu("a-gen", "a", Layout(1, 1), (0,)), Emu("a-gen", "a", Layout(1, 1), (1,))]
    dag = compile_transition(src, tgt, lambda m: 100)  # Split peak: 50 + 100 bytes per GPU
    ok = Scheduler(dag, capacity_bytes=150)
    assert ok.ready() == [0]
    tight = Scheduler(dag, capacity_bytes=200, reserved_bytes={1: 60})
    assert tight.ready() == []
    with pytest.raises(TransitionError, match="no primitive can start"):
        drive(tight, SimulatedExecutor(durations_s(dag, CLUSTER)))
