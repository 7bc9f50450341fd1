"""Tier 1 (pure): co-resident model-stages (phases of one lane share GPUs) in the transition DAG."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.coresident_cases import bytes_now, coresident_case, run_schedule

from nereus.emu.unit import Emu, Layout
from nereus.errors import TransitionError
from nereus.spec.workflow import build_workflow
from nereus.transition.reference.compile import check_collection, compile_plans, compile_transition
from nereus.transition.schedule import Scheduler
from nereus.transition.validate import validate_dag

PPO = build_workflow("ppo", "sync", reward_model=False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**9), st.floats(0.0, 1.0))
def test_coresident_plans_reach_the_target_within_memory(seed: int, cut: float) -> None:
    case = coresident_case(seed)
    wf, sizer, cap = case.workflow, case.sizer, case.capacity_bytes
    sizes = {m: sizer(m) for m in wf.names}
    check_collection(case.source, "source", wf.concurrent)
    try:
        dag = compile_plans(case.current, case.target, case.states, sizer, capacity_bytes=cap,
                            conflicts=wf.concurrent, spare_gpus=case.pool)
    except TransitionError as exc:
        assert "bytes on GPU" in str(exc) or "circular wait" in str(exc), str(exc)
        return
    validate_dag(dag, capacity_bytes=cap, sizer=sizer, conflicts=wf.concurrent)
    # no resource edge between model-stages that may share GPUs
    for a, b in dag.resource_edges:
        assert wf.concurrent(dag.primitives[a].model_stage, dag.primitives[b].model_stage)
    sched = run_schedule(dag, cap, sizes, wf.concurrent)
    assert sched.live == set(case.dest)
    # stopped part-way: the collection is valid, every state kept, and the target reachable
    mid = run_schedule(dag, cap, sizes, wf.concurrent, stop=int(cut * len(dag.primitives))).live
    assert {u.model_stage for u in mid} == set(wf.names)
    pos = {u: k for k, u in enumerate(case.source)}  # the source's order, then the new units
    try:  # the property: a DAG from there reaches the target, or it says why not
        again = compile_transition(sorted(mid, key=lambda u: (pos.get(u, len(pos)), u)),
                                   case.dest, sizer, capacity_bytes=cap,
                                   conflicts=wf.concurrent, spare_gpus=case.pool)
    except TransitionError as exc:  # e.g. a half-done move left too little room to stage
        assert "bytes on GPU" in str(exc) or "circular wait" in str(exc), str(exc)
        return
    validate_dag(again, capacity_bytes=cap, sizer=sizer)


def test_most_random_coresident_cases_compile() -> None:
    """Guards the property test against passing by rejecting: a clear majority compiles with
    room to spare, and none is rejected when memory is unbounded except for a circular wait."""
    compiled = 0
    for seed in range(60):
        case = coresident_case(seed)
        try:
            compile_plans(case.current, case.target, case.states, case.sizer,
                          conflicts=case.workflow.concurrent, spare_gpus=case.pool)
            compiled += 1
        except TransitionError as exc:
            assert "circular wait" in str(exc), str(exc)
    assert compiled >= 50, compiled


def _ppo_units() -> tuple[list[Emu], list[Emu]]:
    """actor-gen, ref-inf and actor-train on GPUs 0–3 (three phases); actor-train moves."""
    gen = [Emu("actor-gen", "actor-gen", Layout(2, 1), (0, 1)),
           Emu("actor-gen", "actor-gen", Layout(2, 1), (2, 3))]
    ref = [Emu("ref-inf", "ref-inf", Layout(1, 1), (g,)) for g in range(4)]
    src = gen + ref + [Emu("actor-train", "actor-train", Layout(2, 1), (0, 1))]
    tgt = gen + ref + [Emu("actor-train", "actor-train", Layout(2, 1), (2, 3))]
    return src, tgt


def test_default_relation_rejects_shared_gpus() -> None:
    src, tgt = _ppo_units()
    with pytest.raises(TransitionError, match="GPU 0 held by"):
        compile_transition(src, tgt, lambda m: 100)
    check_collection(src, "source", PPO.concurrent)  # with the workflow's relation it is valid


def test_acquisition_is_not_blocked_by_a_coresident_unit_but_memory_adds_up() -> None:
    src, tgt = _ppo_units()
    sizes = {"actor-gen": 100, "ref-inf": 100, "actor-train": 400}
    # on GPU 2: gen 50 + ref 100 + train receiving 200 (Extend) = 350; on GPU 0 the sender:
    # gen 50 + ref 100 + train 2 × 200 = 550
    dag = compile_transition(src, tgt, sizes.__getitem__, capacity_bytes=550,
                             conflicts=PPO.concurrent)
    assert dag.counts() == {"Extend": 1, "Destroy": 1}
    assert dag.resource_edges == ()
    validate_dag(dag, capacity_bytes=550, conflicts=PPO.concurrent)
    sched = run_schedule(dag, 550, sizes, PPO.concurrent)
    assert sched.live == set(tgt)
    with pytest.raises(TransitionError, match=r"550 bytes on GPU 0 \(actor-gen 50 \+ actor-train 400 "
                                              r"\+ ref-inf 100\) > capacity 549"):
        compile_transition(src, tgt, sizes.__getitem__, capacity_bytes=549,
                           conflicts=PPO.concurrent)
    # the validator and the scheduler apply the same sum
    with pytest.raises(TransitionError, match="bytes on GPU 0"):
        validate_dag(dag, capacity_bytes=549)
    assert Scheduler(dag, capacity_bytes=549).ready() == []


def test_conflicting_model_stages_still_wait_for_each_other() -> None:
    """critic-train takes actor-train's GPUs (same phase): a resource edge orders them."""
    src = [Emu("actor-gen", "actor-gen", Layout(1, 1), (0,)),
           Emu("actor-train", "actor-train", Layout(1, 1), (0,)),
           Emu("actor-train", "actor-train", Layout(1, 1), (1,)),
           Emu("critic-train", "critic-train", Layout(1, 1), (2,))]
    tgt = [Emu("actor-gen", "actor-gen", Layout(1, 1), (0,)),
           Emu("actor-train", "actor-train", Layout(1, 1), (0,)),
           Emu("critic-train", "critic-train", Layout(1, 1), (1,))]
    dag = compile_transition(src, tgt, lambda m: 10, conflicts=PPO.concurrent)
    assert len(dag.resource_edges) == 1
    (d, e), = dag.resource_edges
    assert dag.primitives[d].model_stage == "actor-train"
    assert dag.primitives[e].model_stage == "critic-train"
    validate_dag(dag, conflicts=PPO.concurrent)
    with pytest.raises(TransitionError, match=r"unordered|still held"):
        validate_dag(dag.without(("resource",)), conflicts=PPO.concurrent)


def test_coresident_buffers_that_do_not_fit_together_are_chained() -> None:
    """actor-gen and actor-train both move off GPU 0: each Extend's sender needs its shard twice;
    together (400 bytes) they exceed 300, one after the other (300) they fit."""
    src = [Emu("actor-gen", "actor-gen", Layout(1, 1), (0,)),
           Emu("actor-train", "actor-train", Layout(1, 1), (0,))]
    tgt = [Emu("actor-gen", "actor-gen", Layout(1, 1), (1,)),
           Emu("actor-train", "actor-train", Layout(1, 1), (1,))]
    size = {"actor-gen": 100, "actor-train": 100}
    dag = compile_transition(src, tgt, size.__getitem__, capacity_bytes=300,
                             conflicts=PPO.concurrent)
    memory = [(a, b) for a, b, k in dag.edges if k == "memory"]
    assert memory and dag.resource_edges == ()
    validate_dag(dag, capacity_bytes=300)
    with pytest.raises(TransitionError, match="400 bytes on GPU 0"):
        validate_dag(dag.without(("memory",)), capacity_bytes=300)
    assert run_schedule(dag, 300, size, PPO.concurrent).live == set(tgt)
    # unconstrained, nothing is chained; below one sender's need it is infeasible
    assert not [k for _, _, k in compile_transition(src, tgt, size.__getitem__,
                                                    conflicts=PPO.concurrent).edges
                if k == "memory"]
    with pytest.raises(TransitionError, match="one primitive at a time"):
        compile_transition(src, tgt, size.__getitem__, capacity_bytes=299,
                           conflicts=PPO.concurrent)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**9), st.integers(0, 10**9))
def test_every_execution_fits_in_memory(seed: int, run_seed: int) -> None:
    """The DAG alone keeps memory: a scheduler that ignores capacity, starting and finishing
    primitives in a random order, never exceeds it (memory edges only where needed)."""
    case = coresident_case(seed)
    wf, cap = case.workflow, case.capacity_bytes
    try:
        dag = compile_plans(case.current, case.target, case.states, case.sizer,
                            capacity_bytes=cap, conflicts=wf.concurrent, spare_gpus=case.pool)
    except TransitionError:
        return
    sizes = {m: case.sizer(m) for m in wf.names}
    rng = random.Random(run_seed)
    sched = Scheduler(dag)  # no capacity: nothing but the DAG orders memory
    while not sched.done:
        for i in sched.ready():
            if not sched.running or rng.random() < 0.6:
                sched.start(i)
        assert sched.running, sched.stall_reason()
        assert max(bytes_now(sched, sizes).values(), default=0) <= cap
        sched.complete(rng.choice(sorted(sched.running)))
    assert sched.live == set(case.dest)
