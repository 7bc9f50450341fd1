"""Tier 1 (pure + the solver extra): the exact transition scheduler, the rules it obeys, the
proof that no transition exists, and the per-component baseline's own plan."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.coresident_cases import coresident_case
from support.dag_cases import reachable_by_brute_force
from support.transition_cases import random_case

from nereus.emu.primitives import Destroy, Extend
from nereus.emu.unit import Emu, Layout
from nereus.errors import TransitionError
from nereus.spec.hardware import H200, ClusterSpec
from nereus.transition.baselines import (
    peer_sequential,
    peer_sequential_run,
    per_component_dag,
    per_component_simulate,
)
from nereus.transition.cost import critical_path_s, durations_s
from nereus.transition.exact import exact_schedule, ticks
from nereus.transition.reachable import min_gpus, reachable
from nereus.transition.reference.compile import compile_transition
from nereus.transition.schedule import simulate
from nereus.transition.schedule_check import check_schedule
from nereus.transition.semantics import occupancies, semantic_edges

CLUSTER = ClusterSpec(4, 8, H200)


def _crossing() -> tuple[list[Emu], list[Emu]]:
    """a and b each release one GPU the other's new replica needs."""
    e = lambda m, g: Emu(m, m[0], Layout(1, 1), (g,))  # noqa: E731
    return ([e("a-inf", 0), e("a-inf", 1), e("b-inf", 2), e("b-inf", 3)],
            [e("a-inf", 0), e("a-inf", 2), e("b-inf", 3), e("b-inf", 1)])


def _coresident(seed: int):  # type: ignore[no-untyped-def]
    c = coresident_case(seed)
    dag = compile_transition(c.source, c.dest, c.sizer, capacity_bytes=c.capacity_bytes,
                             conflicts=c.workflow.concurrent)
    return dag, c.capacity_bytes


def _ours(dag, dur_ticks, capacity=None):  # type: ignore[no-untyped-def]
    """Our scheduler's schedule in integer ticks."""
    sim = simulate(dag, [float(d) for d in dur_ticks], capacity_bytes=capacity)
    return [round(s) for s in sim.start_s], sim.makespan_s


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**9))
def test_exact_is_valid_never_worse_than_ours_and_above_the_local_critical_path(seed: int
                                                                                ) -> None:
    case = random_case(seed)
    if case is None or len(case[0].primitives) > 60:
        return
    dag, _ = case
    dur = durations_s(dag, CLUSTER)
    ex = exact_schedule(dag, dur, time_limit_s=10)
    assert ex.status in ("OPTIMAL", "FEASIBLE")
    assert check_schedule(dag, ex.durations, ex.start) == []
    start, ours = _ours(dag, ex.durations)
    assert check_schedule(dag, ex.durations, start) == []  # ours obeys the same rules
    assert ex.makespan_s <= ours * 1e-6 + 1e-9
    assert ex.hint_s == pytest.approx(ours * 1e-6)
    local = dag.without(("resource", "order", "memory"))
    assert ex.bound_s >= critical_path_s(local, [d * 1e-6 for d in ex.durations]) - 1e-9
    assert ex.bound_s <= ex.makespan_s + 1e-9


def test_exact_beats_our_memory_edges_where_they_over_serialize() -> None:
    dag, cap = _coresident(98)
    assert any(k == "memory" for *_, k in dag.edges)
    dur = durations_s(dag, CLUSTER)
    ex = exact_schedule(dag, dur, capacity_bytes=cap, time_limit_s=10)
    assert ex.optimal
    assert check_schedule(dag, ex.durations, ex.start, capacity_bytes=cap) == []
    start, ours = _ours(dag, ex.durations, cap)
    assert check_schedule(dag, ex.durations, start, capacity_bytes=cap) == []
    assert ex.makespan_s < 0.8 * ours * 1e-6  # 0.100 s against our 0.150 s


def test_without_our_hint_the_solver_finds_its_own_optimum_and_reports_no_hint() -> None:
    """``hint=False`` (the benchmark's hint-free row): nothing of ours is handed to the solver
    (``hint_s`` nan), and alone it still reaches the optimum the hinted run proves, checked by
    the independent checker — shorter than ours, so it did not start from our schedule."""
    dag, cap = _coresident(98)
    dur = durations_s(dag, CLUSTER)
    free = exact_schedule(dag, dur, capacity_bytes=cap, time_limit_s=10, hint=False)
    hinted = exact_schedule(dag, dur, capacity_bytes=cap, time_limit_s=10)
    assert free.optimal and hinted.optimal
    assert free.hint_s != free.hint_s and hinted.hint_s == hinted.hint_s
    assert free.makespan_s == pytest.approx(hinted.makespan_s)
    assert check_schedule(dag, free.durations, free.start, capacity_bytes=cap) == []
    _, ours = _ours(dag, free.durations, cap)
    assert free.makespan_s < 0.8 * ours * 1e-6


def test_memory_binds_the_exact_schedule_and_the_check_sees_an_overflow() -> None:
    dag, cap = _coresident(122)
    dur = durations_s(dag, CLUSTER)
    free = exact_schedule(dag, dur, time_limit_s=10)
    bounded = exact_schedule(dag, dur, capacity_bytes=cap, time_limit_s=10)
    assert free.optimal and bounded.optimal
    assert bounded.makespan_s > free.makespan_s + 0.01
    assert check_schedule(dag, free.durations, free.start) == []
    bad = check_schedule(dag, free.durations, free.start, capacity_bytes=cap)
    assert bad and all(b.startswith("memory: ") for b in bad)
    assert check_schedule(dag, bounded.durations, bounded.start, capacity_bytes=cap) == []


def test_the_check_refuses_an_acquisition_before_the_release() -> None:
    src, tgt = _crossing()
    dag = compile_transition(src, tgt, lambda m: 10**9)
    dur = ticks(durations_s(dag, CLUSTER))
    ext = [i for i, p in enumerate(dag.primitives) if isinstance(p, Extend)]
    des = [i for i, p in enumerate(dag.primitives) if isinstance(p, Destroy)]
    start = [0] * len(dag.primitives)
    for d in des:
        start[d] = 10**6  # each Destroy after the Extend onto the GPU it frees
    bad = check_schedule(dag, dur, start)
    assert bad and all(b.startswith("GPU ownership: ") for b in bad)
    assert check_schedule(dag, dur, [0] * len(dag.primitives)) == []  # releases take no time
    # a local edge broken: the Destroy of a read source before its Extend ends
    src1 = [Emu("a-inf", "a", Layout(2, 1), (0, 1))]
    tgt1 = [Emu("a-inf", "a", Layout(2, 1), (2, 3))]
    one = compile_transition(src1, tgt1, lambda m: 10**9)
    assert any(b.startswith("local edge: ") and "before" in b
               for b in check_schedule(one, ticks(durations_s(one, CLUSTER)), [0, 0]))
    assert ext and (ext[0], des[0]) not in semantic_edges(dag)


def test_occupancies_follow_acquisitions_and_releases() -> None:
    src, tgt = _crossing()
    dag = compile_transition(src, tgt, lambda m: 10**9)
    occ = {(o.model_stage, o.gpu): o for o in occupancies(dag)}
    assert occ[("a-inf", 0)].acquire == -1 and occ[("a-inf", 0)].release == -1
    moved = occ[("b-inf", 1)]  # b acquires GPU 1 with an Extend and keeps it
    assert isinstance(dag.primitives[moved.acquire], Extend) and moved.release == -1
    left = occ[("a-inf", 1)]  # a releases GPU 1 with a Destroy
    assert left.acquire == -1 and isinstance(dag.primitives[left.release], Destroy)


def test_exact_proves_that_no_schedule_fits_a_too_small_memory() -> None:
    src = [Emu("a-inf", "a", Layout(2, 1), (0, 1))]
    tgt = [Emu("a-inf", "a", Layout(1, 1), (0,)), Emu("a-inf", "a", Layout(1, 1), (1,))]
    dag = compile_transition(src, tgt, lambda m: 10**9)  # a Split: old + new shard per GPU
    dur = durations_s(dag, CLUSTER)
    peak = max(max(p.peak_bytes().values()) for p in dag.primitives)
    ex = exact_schedule(dag, dur, capacity_bytes=peak - 1, hint=False, time_limit_s=10)
    assert ex.infeasible and ex.makespan_s != ex.makespan_s
    assert exact_schedule(dag, dur, capacity_bytes=peak, hint=False).optimal


def test_reachable_equals_brute_force_on_single_gpu_replicas() -> None:
    proven = 0
    for seed in range(600):
        rng = random.Random(seed)
        n = rng.randint(2, 6)
        names = [f"m{i}-inf" for i in range(rng.randint(1, 3))]
        # mostly full pools, where swaps have no GPU to stage through
        src = {g: rng.choice(names) for g in range(n)}
        tgt = {g: rng.choice(names) for g in range(n)}
        if set(src.values()) != set(names) or set(tgt.values()) != set(names):
            continue
        e = lambda m, g: Emu(m, m, Layout(1, 1), (g,))  # noqa: E731
        got = reachable([e(m, g) for g, m in src.items()], [e(m, g) for g, m in tgt.items()],
                        range(n), {})
        assert got == reachable_by_brute_force(n, src, tgt), (src, tgt)
        proven += got is False
    assert proven >= 3  # both answers exercised


def test_reachable_is_sound_for_every_compiled_transition() -> None:
    checked = 0
    for seed in range(60):
        case = random_case(seed)
        if case is None:
            continue
        dag, sizer = case
        gpus = {g for u in dag.source + dag.target for g in u.gpus}
        k = {m: min_gpus(sizer(m), 10**15) for m in {u.model_stage for u in dag.source}}
        assert reachable(dag.source, dag.target, gpus, k) is True
        checked += 1
    assert checked > 20
    assert min_gpus(10, 4) == 3 and min_gpus(10, None) == 1


def test_a_copy_that_needs_two_gpus_cannot_shrink_to_one() -> None:
    a = [Emu("a-inf", "a", Layout(2, 1), (0, 1))]
    b = [Emu("b-inf", "b", Layout(1, 1), (2,))]
    # b must move onto GPU 0 while a keeps two GPUs: a needs GPU 2 first, b needs GPU 0 first
    tgt = [Emu("a-inf", "a", Layout(2, 1), (1, 2)), Emu("b-inf", "b", Layout(1, 1), (0,))]
    assert reachable(a + b, tgt, range(3), {"a-inf": 2, "b-inf": 1}) is False
    assert reachable(a + b, tgt, range(4), {"a-inf": 2, "b-inf": 1}) is True  # a spare GPU
    # with a state that fits no single GPU our compiler finds nothing either
    sizes = {"a-inf": 10, "b-inf": 5}
    assert min_gpus(sizes["a-inf"], 6) == 2
    with pytest.raises(TransitionError):
        compile_transition(a + b, tgt, sizes.__getitem__, capacity_bytes=6)


def test_per_component_plans_each_model_stage_alone() -> None:
    src, tgt = _crossing()
    pc = per_component_dag(src, tgt, lambda m: 10**9)
    prims = pc.primitives
    assert all(prims[a].model_stage == prims[b].model_stage for a, b, _ in pc.edges)
    for m in ("a-inf", "b-inf"):
        alone = compile_transition([u for u in src if u.model_stage == m],
                                   [v for v in tgt if v.model_stage == m], lambda m: 10**9)
        assert [p for p in prims if p.model_stage == m] == list(alone.primitives)
    # alone, each copies its replica onto the GPU the other still holds before freeing its own:
    # every order deadlocks, where our DAG (resource edges: Destroy first) runs through
    dur = durations_s(pc, CLUSTER)
    runs = [per_component_simulate(pc, dur, launch_s={"a-inf": 0.0, "b-inf": s / 10},
                                   timeout_s=30.0, rng=random.Random(s)) for s in range(10)]
    assert all(not r.success and "deadlock" in r.reason for r in runs)
    ours = compile_transition(src, tgt, lambda m: 10**9)
    assert simulate(ours, durations_s(ours, CLUSTER)).makespan_s < 1.0
    # a component that cannot plan its move even alone: its only copy sits on a GPU its target
    # needs and its state fits no single GPU (no finer layout to split into)
    with pytest.raises(TransitionError, match="alone"):
        per_component_dag([Emu("a-inf", "a", Layout(2, 1), (0, 1))],
                          [Emu("a-inf", "a", Layout(2, 1), (1, 2))], lambda m: 10,
                          capacity_bytes=6)


def test_the_peer_migrates_model_stage_by_model_stage_release_before_acquire() -> None:
    """The peer baseline (``peer_sequential``): each model-stage's own migration, planned alone,
    one model-stage after the other in stage order, Destroys before Extends; an Extend copies a
    replica that stays rather than one about to be freed."""
    e = lambda m, g: Emu(m, m[0], Layout(1, 1), (g,))  # noqa: E731
    # a-gen frees GPU 1 and b-inf then takes it: in stage order it runs through
    src, tgt = [e("a-gen", 0), e("a-gen", 1), e("b-inf", 2)], [e("a-gen", 0), e("b-inf", 2),
                                                               e("b-inf", 1)]
    pc = per_component_dag(src, tgt, lambda m: 10**9)
    dur = durations_s(pc, CLUSTER)
    ok = peer_sequential_run(pc, dur)
    seq = peer_sequential(pc)
    alone = []
    for m in ("a-gen", "b-inf"):
        own = per_component_dag([u for u in src if u.model_stage == m],
                                [v for v in tgt if v.model_stage == m], lambda m: 10**9)
        alone.append(simulate(own, durations_s(own, CLUSTER)).makespan_s)
    assert ok.success and ok.time_s == pytest.approx(sum(alone))  # one after the other
    t = ticks(dur)
    start = [round(x) for x in simulate(seq, [float(d) for d in t]).start_s]
    assert check_schedule(seq, t, start) == []  # the peer's run obeys every rule
    # the same move in the other stage order: b-inf's turn comes first, GPU 1 is still a-inf's
    src2 = [Emu("a-inf", "a", Layout(1, 1), (0,)), Emu("a-inf", "a", Layout(1, 1), (1,)),
            Emu("b-gen", "b", Layout(1, 1), (2,))]
    tgt2 = [Emu("a-inf", "a", Layout(1, 1), (0,)), Emu("b-gen", "b", Layout(1, 1), (2,)),
            Emu("b-gen", "b", Layout(1, 1), (1,))]
    pc2 = per_component_dag(src2, tgt2, lambda m: 10**9)
    stuck = peer_sequential_run(pc2, durations_s(pc2, CLUSTER), timeout_s=60.0)
    assert not stuck.success and stuck.time_s == 60.0 and "GPUs held by a-inf" in stuck.reason
    ours = compile_transition(src2, tgt2, lambda m: 10**9)
    assert simulate(ours, durations_s(ours, CLUSTER)).makespan_s < 1.0  # ours orders it
    # release before acquire: a-inf's move from GPU 1 to 3 copies the replica on GPU 0, which
    # stays, so its Destroy of GPU 1 no longer waits for the copy
    src3 = [e("a-inf", 0), e("a-inf", 1)]
    tgt3 = [e("a-inf", 0), e("a-inf", 3)]
    raw = per_component_dag(src3, tgt3, lambda m: 10**9)
    peer = peer_sequential(raw)
    (ext,) = [p for p in peer.primitives if isinstance(p, Extend)]
    (des,) = [i for i, p in enumerate(peer.primitives) if isinstance(p, Destroy)]
    assert ext.src.gpus == (0,)
    x = peer.primitives.index(ext)
    assert (des, x, "order") in peer.edges and (x, des, "data") not in peer.edges
