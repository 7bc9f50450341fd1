"""Pure core: node-aware GPU assignment of chosen candidates."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support.plan_cases import CALIB, llama_setup, pools, problem_of, random_feasible_choice, setups

from nereus.errors import InfeasiblePlanError
from nereus.plan.assign import assign, node_loss_survivors, placement_errors
from nereus.plan.candidates import level_capacity, node_counts, pool_levels
from nereus.plan.problem import Problem, within_budget
from nereus.plan.search import search_plan
from nereus.spec.job import Setup
from nereus.spec.plan import Candidate, ExecutionPlan, StagePlan


def _drawn_choice(data: st.DataObject) -> tuple[Setup, tuple[int, ...], Problem, Any]:
    """A setup, a pool of it and a budget-feasible choice of candidates (assumed to exist)."""
    setup = data.draw(setups(max_nodes=4, gpus_per_node=(1, 2, 3, 4, 8), max_batch=16,
                             memory_factors=(3.0, 8.0)))
    pool = data.draw(pools(setup))
    try:
        problem = problem_of(setup, pool)
    except InfeasiblePlanError:
        assume(False)
        raise
    choice = random_feasible_choice(problem, data.draw(st.integers(0, 10**6)))
    assume(choice is not None)
    return setup, tuple(pool), problem, choice


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_budget_feasible_choice_is_placed_validly(data: st.DataObject) -> None:
    """The level condition is sufficient: largest-first placement never fails on it."""
    setup, pool, problem, choice = _drawn_choice(data)
    assert choice is not None and within_budget(problem, choice)
    cands = {n: c.cand for n, c in choice.items()}
    plan = assign(setup, cands, pool)
    assert placement_errors(setup, plan, pool) == []
    assert assign(setup, cands, tuple(reversed(pool))) == plan  # deterministic, order-free
    gpn = setup.cluster.gpus_per_node
    for sp in plan.stages:
        assert sp.candidate == cands[sp.name]
        for rep in sp.replicas:
            if sp.tp * sp.pp <= gpn:
                assert len({g // gpn for g in rep}) == 1
            else:  # whole nodes, pipeline stages in node order
                nodes = [g // gpn for g in rep]
                assert all(nodes.count(n) == gpn for n in set(nodes))


def test_level_capacity_counts_whole_blocks_per_node() -> None:
    pool = (0, 1, 2, 4, 5, 6, 7, 8, 9)  # node 0: 7 GPUs (3 missing), node 1: 2 GPUs of 8
    assert node_counts(pool, 8) == ((0, 7), (1, 2))
    assert [level_capacity([7, 2], s) for s in (1, 2, 4, 8)] == [9, 8, 4, 0]
    assert pool_levels(pool, 8) == ((1, 2, 4, 8), (9, 8, 4, 0))
    assert pool_levels(tuple(range(16)), 8) == ((1,), (16,))


def test_tp_groups_stay_inside_a_node_after_failures() -> None:
    setup = llama_setup(2)
    pool = (0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 13)  # node 0 lost GPU 3; node 1 has 5 GPUs
    a = Candidate("actor-gen", 4, 1, 2, 128, 1)
    choice = {
        "actor-gen": a,
        "ref-inf": Candidate("ref-inf", 2, 1, 2, 4, 32),
        "critic-inf": Candidate("critic-inf", 4, 1, 1, 8, 64),
        "actor-train": Candidate("actor-train", 4, 1, 2, 1, 256),
        "critic-train": Candidate("critic-train", 1, 1, 4, 1, 128),
    }
    # demand per level (1, 2, 4): (12, 8, 8); capacity (12, 10, 8)
    plan = assign(setup, choice, pool)
    assert placement_errors(setup, plan, pool) == []
    for rep in plan.stage("actor-gen").replicas:
        assert len({g // 8 for g in rep}) == 1
    # one more GPU at level 2 breaks the budget: critic-train tp2 needs (12, 12, 8) > (12, 10, 8)
    choice["critic-train"] = Candidate("critic-train", 2, 1, 2, 1, 256)
    with pytest.raises(InfeasiblePlanError):
        assign(setup, choice, pool)


def test_inference_replicas_spread_over_nodes() -> None:
    setup = llama_setup(2)
    choice = {
        "actor-gen": Candidate("actor-gen", 2, 1, 2, 256, 1),
        "ref-inf": Candidate("ref-inf", 1, 1, 2, 8, 32),
        "critic-inf": Candidate("critic-inf", 1, 1, 2, 8, 32),
        "actor-train": Candidate("actor-train", 2, 1, 2, 1, 256),
        "critic-train": Candidate("critic-train", 2, 1, 2, 1, 256),
    }
    plan = assign(setup, choice, setup.cluster.all_gpus())
    assert placement_errors(setup, plan, setup.cluster.all_gpus()) == []
    survive = node_loss_survivors(setup, plan)
    for name in ("actor-gen", "ref-inf", "critic-inf"):
        assert survive[name], name
        assert len({rep[0] // 8 for rep in plan.stage(name).replicas}) == 2
    # training that fits a node stays in one node: its gradient all-reduce is intra-node
    for name in ("actor-train", "critic-train"):
        assert len({g // 8 for g in plan.stage(name).gpus}) == 1


def test_concurrent_stages_disjoint_and_serial_phases_reuse_gpus() -> None:
    setup = llama_setup(1)
    choice = {
        "actor-gen": Candidate("actor-gen", 8, 1, 1, 512, 1),
        "ref-inf": Candidate("ref-inf", 2, 1, 2, 8, 32),
        "critic-inf": Candidate("critic-inf", 2, 1, 2, 8, 32),
        "actor-train": Candidate("actor-train", 4, 1, 1, 1, 512),
        "critic-train": Candidate("critic-train", 4, 1, 1, 1, 512),
    }
    plan = assign(setup, choice, tuple(range(8)))
    assert placement_errors(setup, plan, tuple(range(8))) == []
    assert not set(plan.stage("ref-inf").gpus) & set(plan.stage("critic-inf").gpus)
    assert set(plan.stage("actor-gen").gpus) == set(range(8))
    assert set(plan.stage("actor-train").gpus) | set(plan.stage("critic-train").gpus) == set(range(8))


def test_over_budget_choice_is_refused() -> None:
    setup = llama_setup(1)
    choice = {
        "actor-gen": Candidate("actor-gen", 8, 1, 1, 512, 1),
        "ref-inf": Candidate("ref-inf", 4, 1, 1, 8, 64),
        "critic-inf": Candidate("critic-inf", 8, 1, 1, 8, 64),  # 4 + 8 > 8 GPUs
        "actor-train": Candidate("actor-train", 4, 1, 1, 1, 512),
        "critic-train": Candidate("critic-train", 4, 1, 1, 1, 512),
    }
    with pytest.raises(InfeasiblePlanError):
        assign(setup, choice, tuple(range(8)))


def test_placement_errors_catch_broken_plans() -> None:
    setup = llama_setup(2)
    res = search_plan(setup, CALIB)
    pool = setup.cluster.all_gpus()
    assert placement_errors(setup, res.plan, pool) == []
    gen = res.plan.stage("actor-gen")
    bad_rep = (7, 8, *gen.replicas[0][2:]) if gen.tp >= 2 else gen.replicas[0]
    broken = ExecutionPlan(tuple(
        StagePlan.place(sp.candidate, (bad_rep, *sp.replicas[1:])) if sp.name == "actor-gen" else sp
        for sp in res.plan.stages
    ))
    if gen.tp >= 2:
        assert any("spans nodes" in e for e in placement_errors(setup, broken, pool))
    assert placement_errors(setup, res.plan, pool[:-1])  # a GPU outside the pool


def _mutations(plan: ExecutionPlan, pool: tuple[int, ...], gpn: int) -> list[ExecutionPlan]:
    """Plans that break one placement rule each (where the plan has room to break it)."""
    out = []
    stages = list(plan.stages)
    for i, sp in enumerate(stages):
        reps = [list(r) for r in sp.replicas]
        if not reps or not reps[0]:
            continue

        def with_reps(new: list[list[int]], i: int = i, sp: StagePlan = sp) -> ExecutionPlan:
            st = list(stages)
            st[i] = StagePlan.place(sp.candidate, tuple(tuple(r) for r in new))
            return ExecutionPlan(tuple(st))

        outside = max(pool) + 1 + gpn  # a GPU not in the pool, on another node
        out.append(with_reps([[outside, *reps[0][1:]], *reps[1:]]))
        if len(reps[0]) > 1:  # a GPU twice in a replica
            out.append(with_reps([[reps[0][0], reps[0][0], *reps[0][2:]], *reps[1:]]))
            moved = [g for g in pool if g // gpn != reps[0][0] // gpn]
            if moved:  # a replica (or TP group) across nodes
                out.append(with_reps([[reps[0][0], moved[0], *reps[0][2:]], *reps[1:]]))
        if len(reps) > 1:  # two replicas sharing a GPU
            out.append(with_reps([reps[0], [reps[0][0], *reps[1][1:]], *reps[2:]]))
            out.append(with_reps(reps[:-1]))  # fewer replicas than dp
        for j, other in enumerate(stages):  # another model-stage's GPU (concurrent or not)
            if j != i and other.replicas:
                out.append(with_reps([[other.replicas[0][0], *reps[0][1:]], *reps[1:]]))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_array_check_agrees_with_the_rules_one_by_one(data: st.DataObject) -> None:
    """placement_errors' array check (the search's hot path at thousands of GPUs) passes a plan
    only where the rule-by-rule loop finds nothing, and passes every plan the placement makes."""
    from nereus.plan.assign import placement_ok, placement_rule_errors

    setup, pool, _, choice = _drawn_choice(data)
    assert choice is not None
    plan = assign(setup, {n: c.cand for n, c in choice.items()}, pool)
    gpn, wf = setup.cluster.gpus_per_node, setup.job.workflow
    assert placement_ok(gpn, plan, pool, wf) and placement_rule_errors(gpn, plan, pool, wf) == []
    broken = 0
    for bad in _mutations(plan, tuple(pool), gpn):
        loop = placement_rule_errors(gpn, bad, pool, wf)
        assert not (placement_ok(gpn, bad, pool, wf) and loop), loop  # never passes a broken one
        assert placement_errors(setup, bad, pool) == loop
        broken += bool(loop)
    assert broken > 0 or not _mutations(plan, tuple(pool), gpn)
