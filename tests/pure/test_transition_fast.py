"""Tier 1 (pure): the batched planning path (:mod:`nereus.transition.batched.plan`) gives the reference
compiler's DAG — the same primitives, edges, order and L̂_tran, or the same error — on random
placements (no periodic structure), capacity-bound, co-resident and interrupted collections."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.coresident_cases import coresident_case
from support.transition_cases import case

from nereus.emu.primitives import StateSizer, model_state_sizer
from nereus.emu.unit import Emu, Layout, emus_of_plan
from nereus.errors import TransitionError
from nereus.spec.hardware import H200, ClusterSpec
from nereus.spec.model import LLAMA_3_1_8B, TINY_GPT
from nereus.spec.plan import ExecutionPlan, StagePlan
from nereus.spec.workflow import build_workflow
from nereus.transition import planned
from nereus.transition.batched import plan as fast
from nereus.transition.cost import transition_cost_s
from nereus.transition.planned import PlannedTransition
from nereus.transition.reference.compile import compile_plans, compile_transition
from nereus.transition.schedule import Scheduler
from nereus.transition.wire import dag_from_wire, dag_to_wire


@pytest.fixture(autouse=True)
def _always_batched(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small cases too take the batched path here (the switch to the reference is for speed)."""
    monkeypatch.setattr(fast, "SMALL_UNITS", 0)


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _cluster(pool: list[int], gpn: int = 2) -> ClusterSpec:
    return ClusterSpec(max(1, -(-(max(pool) + 1) // gpn)), gpn, H200)


ANY_CLUSTER = ClusterSpec(64, 8, H200)  # where the cost is not compared


def plan_plans(*args, cluster: ClusterSpec = ANY_CLUSTER, **kw) -> PlannedTransition:  # type: ignore[no-untyped-def]
    return planned.plan_plans(*args, cluster, **kw)


def plan_transition(*args, cluster: ClusterSpec = ANY_CLUSTER, **kw) -> PlannedTransition:  # type: ignore[no-untyped-def]
    return planned.plan_units(*args, cluster, **kw)


def plans_on(cluster: ClusterSpec, *args, **kw) -> PlannedTransition:  # type: ignore[no-untyped-def]
    return planned.plan_plans(*args, cluster, **kw)


def units_on(cluster: ClusterSpec, *args, **kw) -> PlannedTransition:  # type: ignore[no-untyped-def]
    return planned.plan_units(*args, cluster, **kw)


def _outcome(fn):  # type: ignore[no-untyped-def]
    try:
        return fn(), None
    except TransitionError as exc:
        return None, str(exc)


def _same(ref_fn, fast_fn, cluster: ClusterSpec, covered: bool = True) -> PlannedTransition | None:  # type: ignore[no-untyped-def]
    """The reference and the batched path agree: the same DAG and L̂_tran, or the same error."""
    ref, ref_err = _outcome(ref_fn)
    got, got_err = _outcome(lambda: fast_fn(cluster))
    assert ref_err == got_err
    if ref is None:
        return None  # the batched path declines what the reference rejects: the same error
    # where a DAG exists these cases are all the batched path covers: it made this one, so the
    # comparison below is of the two compilers, never of the reference with itself
    assert not covered or got.path == "batched", "the batched path declined a case it covers"
    dag = got.dag
    assert dag.primitives == ref.primitives
    assert dag.edges == ref.edges
    assert dag.order == ref.order
    assert dag == ref  # and source, target, t_sub, conflicts, sizes
    assert got.cost_s == transition_cost_s(ref, cluster)
    return got


def _replicated(rng: random.Random, sizer: StateSizer) -> StateSizer | None:
    if rng.random() < 0.5:
        return None
    frac = rng.choice([0.01, 0.06, 0.2])
    return lambda m: int(sizer(m) * frac)


@SETTINGS
@given(st.integers(0, 10**9), st.sampled_from(["none", "loose", "tight"]))
def test_random_placements_match_the_reference(seed: int, memory: str) -> None:
    cur, tgt, states, sizer, pool = case(seed)
    rng = random.Random(seed)
    src, dst = emus_of_plan(cur, states), emus_of_plan(tgt, states)
    cap = None
    if memory != "none":
        top = max(-(-sizer(u.model_stage) // u.layout.size) for u in src)
        cap = top * (4 if memory == "loose" else 1) + rng.randint(1, 10**5)
    rep = _replicated(rng, sizer)
    spare = pool if rng.random() < 0.5 else []
    kw = dict(capacity_bytes=cap, spare_gpus=spare, replicated=rep)
    cl = _cluster(pool, rng.choice([1, 2, 4]))
    _same(lambda: compile_plans(cur, tgt, states, sizer, **kw),
          lambda cl_: plans_on(cl_, cur, tgt, states, sizer, **kw), cl)
    _same(lambda: compile_transition(src, dst, sizer, **kw),
          lambda cl_: units_on(cl_, src, dst, sizer, **kw), cl)


@SETTINGS
@given(st.integers(0, 10**9))
def test_coresident_placements_match_the_reference(seed: int) -> None:
    c = coresident_case(seed)
    kw = dict(capacity_bytes=c.capacity_bytes, conflicts=c.workflow.concurrent,
              spare_gpus=c.pool)
    cl = _cluster(c.pool)
    # covered=False: a batch of co-resident primitives that does not fit goes to the reference
    # (which orders phases); the share of such cases is bounded below
    _same(lambda: compile_plans(c.current, c.target, c.states, c.sizer, **kw),
          lambda cl_: plans_on(cl_, c.current, c.target, c.states, c.sizer, **kw), cl,
          covered=False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**9), st.floats(0.0, 1.0))
def test_interrupted_collections_match_the_reference(seed: int, cut: float) -> None:
    """Mixed layouts inside a model-stage (a transition stopped part-way) go to the reference."""
    cur, tgt, states, sizer, pool = case(seed)
    try:
        dag = compile_plans(cur, tgt, states, sizer, spare_gpus=pool)
    except TransitionError:
        return
    sched = Scheduler(dag)
    for _ in range(int(cut * len(dag.primitives))):
        for i in sched.ready():
            sched.start(i)
        sched.complete(min(sched.running))
    mid = tuple(sorted(sched.live))
    dst = emus_of_plan(tgt, states)
    _same(lambda: compile_transition(mid, dst, sizer, spare_gpus=pool),
          lambda cl_: units_on(cl_, mid, dst, sizer, spare_gpus=pool), _cluster(pool),
          covered=False)  # a model-stage of mixed layouts: the reference's by design


@SETTINGS
@given(st.integers(0, 10**9))
def test_survivors_on_a_smaller_pool_match_the_reference(seed: int) -> None:
    cur, tgt, states, sizer, pool = case(seed)
    rng = random.Random(seed)
    alive = sorted(rng.sample(pool, max(1, len(pool) - rng.randint(0, 2))))
    live = set(alive)
    src = tuple(u for u in emus_of_plan(cur, states) if live.issuperset(u.gpus))
    _same(lambda: compile_transition(src, emus_of_plan(tgt, states), sizer),
          lambda cl_: plans_on(cl_, cur, tgt, states, sizer, alive=alive), _cluster(pool))


@st.composite
def _executor_collections(draw: st.DrawFn) -> tuple[tuple[Emu, ...], tuple[Emu, ...]]:
    """Collections like those ``test_dag_exec_gloo`` executes: 4 GPUs, tiny-gpt layouts."""
    def one(name: str) -> list[Emu]:
        lay = draw(st.sampled_from([Layout(t, p) for t in (1, 2) for p in (1, 2, 4)
                                    if t * p <= 4]))
        dp = draw(st.integers(1, 4 // lay.size))
        gpus = draw(st.permutations(range(4)))
        return [Emu(name, name, lay, tuple(gpus[r * lay.size:(r + 1) * lay.size]))
                for r in range(dp)]

    names = ("actor-train", "actor-gen")
    return (tuple(u for n in names for u in one(n)), tuple(u for n in names for u in one(n)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_executor_collections())
def test_executor_sized_collections_match_the_reference(units: tuple[tuple[Emu, ...],
                                                                     tuple[Emu, ...]]) -> None:
    src, dst = units
    sizer = model_state_sizer({m: TINY_GPT for m in ("actor-train", "actor-gen")},
                              {"actor-train": True, "actor-gen": False})
    conflicts = build_workflow("ppo", "sync", reward_model=False).concurrent
    got = _same(lambda: compile_transition(src, dst, sizer, conflicts=conflicts),
                lambda cl_: units_on(cl_, src, dst, sizer, conflicts=conflicts),
                ClusterSpec(2, 2, H200))
    if got is not None:
        assert dag_from_wire(dag_to_wire(got.dag)) == got.dag


def _blocks(n: int, spec: tuple[tuple[str, int, int, int], ...]) -> ExecutionPlan:
    """Each model-stage a block of n·sixteenths/16 GPUs, replicas in order (as the benchmark)."""
    stages, off = [], 0
    for name, sixteenths, tp, pp in spec:
        size = n * sixteenths // 16
        reps = tuple(tuple(range(off + r * tp * pp, off + (r + 1) * tp * pp))
                     for r in range(size // (tp * pp)))
        stages.append(StagePlan(name, tp, pp, len(reps), 1, 1, replicas=reps))
        off += size
    return ExecutionPlan(tuple(stages))


PPO = build_workflow("ppo", "sync", reward_model=True)
STATES = {n: n for n in PPO.names}


LLAMA = model_state_sizer({m: LLAMA_3_1_8B for m in PPO.names},
                          {m: m.endswith("-train") for m in PPO.names})


def test_disjoint_block_plans_take_the_batched_path() -> None:
    cur = _blocks(64, (("actor-gen", 4, 2, 1), ("ref-inf", 2, 1, 1), ("reward-inf", 2, 2, 1),
                       ("critic-inf", 2, 1, 1), ("actor-train", 4, 4, 2),
                       ("critic-train", 2, 4, 1)))
    tgt = _blocks(64, (("actor-gen", 6, 1, 1), ("ref-inf", 1, 2, 1), ("reward-inf", 1, 1, 1),
                       ("critic-inf", 2, 2, 1), ("actor-train", 4, 8, 1),
                       ("critic-train", 2, 2, 2)))
    got = _same(lambda: compile_plans(cur, tgt, STATES, LLAMA, capacity_bytes=H200.memory_bytes),
                lambda cl_: plans_on(cl_, cur, tgt, STATES, LLAMA, capacity_bytes=H200.memory_bytes),
                ClusterSpec(8, 8, H200))
    assert got is not None and got.batched is not None
    # the executor's wire format carries the expanded DAG unchanged (plain ints throughout)
    assert dag_from_wire(dag_to_wire(got.dag)) == got.dag


def test_coresident_phase_plans_order_memory_on_the_batched_path() -> None:
    """Every phase spans the pool: the memory ordering runs on the arrays and agrees."""
    def phases(spec: tuple[tuple[tuple[str, int, int, int], ...], ...]) -> ExecutionPlan:
        stages = [sp for phase in spec for sp in _blocks(32, phase).stages]
        return ExecutionPlan(tuple(sorted(stages, key=lambda sp: PPO.names.index(sp.name))))

    cur = phases(((("actor-gen", 16, 2, 1),),
                  (("ref-inf", 4, 1, 1), ("reward-inf", 4, 2, 1), ("critic-inf", 8, 1, 1)),
                  (("actor-train", 8, 4, 2), ("critic-train", 8, 4, 1))))
    tgt = phases(((("actor-gen", 16, 4, 1),),
                  (("critic-inf", 8, 2, 1), ("reward-inf", 6, 1, 1), ("ref-inf", 2, 2, 1)),
                  (("critic-train", 8, 2, 2), ("actor-train", 8, 8, 1))))
    kw = dict(capacity_bytes=H200.memory_bytes, conflicts=PPO.concurrent)
    got = _same(lambda: compile_plans(cur, tgt, STATES, LLAMA, **kw),
                lambda cl_: plans_on(cl_, cur, tgt, STATES, LLAMA, **kw), ClusterSpec(4, 8, H200))
    assert got is not None and got.batched is not None
    assert got.batched.extra  # "memory" edges were needed and built on the arrays
    assert all(kind == "memory" for _, _, kind in got.batched.extra)


def test_most_random_cases_take_the_batched_path() -> None:
    """Guards the equality tests against passing by always falling back: of the generated
    cases, those with a DAG all take the batched path, and they are most of the cases."""
    batched = compiled = 0
    for seed in range(80):
        cur, tgt, states, sizer, pool = case(seed)
        try:
            got = plan_plans(cur, tgt, states, sizer, spare_gpus=pool)
        except TransitionError:
            continue
        compiled += 1
        batched += got.batched is not None
    assert compiled >= 40 and batched == compiled


def test_most_coresident_cases_take_the_batched_path() -> None:
    """As above for the co-resident generator, where a batch of co-resident primitives that
    does not fit goes to the reference (it orders phases): at least 80% of the cases with a DAG
    take the batched path (the rest of the generated cases are memory-infeasible targets, which
    both compilers refuse with the same error)."""
    batched = compiled = 0
    for seed in range(80):
        c = coresident_case(seed)
        try:
            got = plan_plans(c.current, c.target, c.states, c.sizer,
                             capacity_bytes=c.capacity_bytes, conflicts=c.workflow.concurrent,
                             spare_gpus=c.pool)
        except TransitionError:
            continue
        compiled += 1
        batched += got.batched is not None
    assert compiled >= 32 and batched >= 0.8 * compiled, (batched, compiled)


def test_small_transitions_go_to_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast, "SMALL_UNITS", 48)
    cur, tgt, states, sizer, pool = case(3)
    got = plan_plans(cur, tgt, states, sizer, spare_gpus=pool)
    assert got.batched is None
    assert got.dag == compile_plans(cur, tgt, states, sizer, spare_gpus=pool)


def test_inputs_the_batched_path_does_not_cover_fall_back() -> None:
    a = Emu("a-inf", "a", Layout(1, 1), (0,))
    b = Emu("a-inf", "a", a.layout, (1,))
    # per-GPU capacities go to the reference compiler, with its result
    got = plan_transition([a], [b], lambda m: 10, capacity_bytes={0: 100, 1: 100})
    assert got.batched is None
    assert got.dag == compile_transition([a], [b], lambda m: 10,
                                         capacity_bytes={0: 100, 1: 100})
    # invalid collections raise the reference's error
    with pytest.raises(TransitionError, match="GPU 0 held by a-inf and a-inf"):
        plan_transition([a, Emu("a-inf", "a", a.layout, (0,))], [b], lambda m: 10)


def test_replica_matrices_are_read_once_per_plan_object_and_leave_with_it() -> None:
    """The current plan's matrices are kept between plannings (it was the last target); a new
    plan object is read afresh, an equal one gives the same DAG, and an entry goes with its
    plan."""
    import dataclasses
    import gc

    spec = (("actor-gen", 4, 2, 1), ("ref-inf", 2, 1, 1), ("actor-train", 10, 4, 1))
    cur = _blocks(64, spec)
    tgt = _blocks(64, (("actor-gen", 8, 1, 1), ("ref-inf", 4, 2, 1), ("actor-train", 4, 8, 1)))
    first = plan_plans(cur, tgt, STATES, LLAMA).dag
    rows = fast.stage_rows(cur.stages[0])
    assert rows is not None and not rows.flags.writeable
    assert fast.stage_rows(cur.stages[0]) is rows  # kept
    equal = ExecutionPlan(tuple(dataclasses.replace(sp) for sp in tgt.stages))
    keys = [id(sp) for sp in equal.stages]
    assert plan_plans(cur, equal, STATES, LLAMA).dag == first
    assert all(k in fast.ROW_CACHE for k in keys)
    del equal
    gc.collect()
    assert not any(k in fast.ROW_CACHE for k in keys)
    # a plan whose replicas changed is a new object: read afresh
    gen = tgt.stages[0]
    moved = ExecutionPlan((dataclasses.replace(gen, replicas=gen.replicas[::-1]),) + tgt.stages[1:])
    assert plan_plans(cur, moved, STATES, LLAMA).dag == compile_plans(cur, moved, STATES, LLAMA)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=300), st.integers(0, 50), st.booleans())
def test_a_lone_donor_reads_as_the_round_replay(blocked: list[bool], donor: int,
                                                free: bool) -> None:
    """The shortcut for a pool of only the donor gives the round-by-round replay's order."""
    import numpy as np

    from nereus.transition.batched.sources import heap_rounds, replay_rounds

    n = len(blocked)
    slots = np.arange(100, 100 + n)
    args = (np.array([donor]), np.array([free]), slots, np.array(blocked))
    got = heap_rounds(*args, donor)
    want = replay_rounds(*args, donor, np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64))
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(1, 60), st.integers(0, 20))
def test_a_pool_that_fills_every_slot_reads_as_the_round_replay(data: st.DataObject, n: int,
                                                                more: int) -> None:
    """The shortcut for a pool at least as large as the slots gives the replay's order."""
    import numpy as np

    from nereus.transition.batched.sources import heap_rounds, replay_rounds

    k = n + more
    pool = np.array(data.draw(st.lists(st.integers(0, 999), min_size=k, max_size=k,
                                       unique=True)))
    free = np.array(data.draw(st.lists(st.booleans(), min_size=k, max_size=k)))
    blocked = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    slots = np.arange(2000, 2000 + n)
    got = heap_rounds(pool, free, slots, blocked, -1)
    want = replay_rounds(pool, free, slots, blocked, -1, np.empty(n, dtype=np.int64),
                   np.empty(n, dtype=np.int64))
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
