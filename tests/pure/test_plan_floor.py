"""The memory-aware bounds of the DP (nereus.plan.floor, issue 37): on pools of whole nodes the
floor of one lane is its optimum, every point the optimum uses has its bound within it, and the
DP that starts from them returns what the exhaustive search and the DP without them return."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support.plan_cases import CALIB, llama_setup, problem_of, setups

from nereus.errors import InfeasiblePlanError
from nereus.plan import dp
from nereus.plan.exhaustive import SearchLimitError
from nereus.plan.floor import lane_bounds, minimal_levels
from nereus.plan.problem import step_s
from nereus.plan.search import search_plan
from nereus.spec.hardware import A100_64GB


def _whole_nodes(setup: object) -> tuple[int, ...]:
    return setup.cluster.all_gpus()  # type: ignore[attr-defined]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.filter_too_much])
@given(data=st.data(), tight=st.booleans())
def test_floor_is_the_optimum_of_one_lane_and_bounds_every_point_it_uses(
        data: st.DataObject, tight: bool) -> None:
    setup = data.draw(setups(max_nodes=2, gpus_per_node=(1, 2, 4), max_batch=4,
                             memory_factors=(1.0, 1.4) if tight else None))
    pool = _whole_nodes(setup)
    try:
        problem = problem_of(setup, pool)
    except InfeasiblePlanError:  # a model-stage fits nowhere: no bound to check
        assume(False)
        return
    assume(math.prod(max(1, len(s.feasible)) for s in problem.spaces) <= 30_000)
    try:
        ex = search_plan(setup, CALIB, pool=pool, method="exhaustive", time_limit_s=10)
    except SearchLimitError:
        assume(False)
        return
    except InfeasiblePlanError:
        ex = None
    pts = {s.name: dp.stage_points(s.table, problem.levels, problem.caps)
           for s in problem.spaces}
    lanes = problem.workflow.lanes
    bounds = [lane_bounds([[pts[n] for n in phase] for phase in lane], problem.caps[0],
                          problem.capacity_bytes) for lane in lanes]
    if ex is None:  # nothing fits: some lane's floor says so, or the lanes' budgets clash
        assert len(lanes) > 1 or bounds[0].floor_s == math.inf
        return
    opt = ex.predicted_step_s
    assert all(b.floor_s <= opt * (1 + 1e-9) for b in bounds)
    if len(lanes) == 1:
        assert math.isclose(bounds[0].floor_s, opt, rel_tol=1e-9)
    # each chosen candidate has a frontier dominator (as fast, no more GPUs or bytes) whose
    # bound is within the optimum: the DP never drops what the optimum needs
    for lane, b in zip(lanes, bounds, strict=True):
        for phase, per_stage in zip(lane, b.need_s, strict=True):
            for name, need in zip(phase, per_stage, strict=True):
                chosen = ex.plan.stage(name).candidate
                (c,) = [x for x in problem.space(name).feasible if x.cand == chosen]
                doms = [need[i] for i, p in enumerate(pts[name])
                        if p[0] <= c.latency_s and p[1][0] <= c.num_gpus
                        and p[2] <= c.persistent_bytes and p[3] <= c.peak_bytes]
                assert doms and min(doms) <= opt * (1 + 1e-9), (name, doms, opt)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.filter_too_much])
@given(data=st.data(), tight=st.booleans())
def test_dp_from_the_memory_bounds_equals_the_dp_without_them(
        data: st.DataObject, tight: bool) -> None:
    setup = data.draw(setups(max_nodes=3, gpus_per_node=(1, 2, 4), max_batch=8,
                             memory_factors=(1.0, 1.4) if tight else None))
    pool = _whole_nodes(setup)
    try:
        problem = problem_of(setup, pool)
    except InfeasiblePlanError:
        assume(False)
        return
    plain = dp.solve(problem)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(dp, "MEMORY_BOUND_POINTS", 0)  # every failed first round switches
        bounded = dp.solve(problem)
    assert (plain is None) == (bounded is None)
    if plain is not None and bounded is not None:
        assert math.isclose(step_s(problem, plain), step_s(problem, bounded), rel_tol=1e-9)


def test_binding_co_residency_is_found_from_the_memory_floor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama-3.1-8B PPO on 2 nodes of A100-64GB, where co-residency binds (the relaxed floor is
    below the optimum): the memory-aware floor equals the optimum and the DP started from it
    returns the MILP's plan latency."""
    setup = llama_setup(2, gen_len=2048, global_batch=256, gpu=A100_64GB)
    problem = problem_of(setup, setup.cluster.all_gpus())
    pts = {s.name: dp.stage_points(s.table, problem.levels, problem.caps)
           for s in problem.spaces}
    (lane,) = problem.workflow.lanes
    b = lane_bounds([[pts[n] for n in phase] for phase in lane], problem.caps[0],
                    problem.capacity_bytes)
    res = search_plan(setup, CALIB)
    assert sum(b.phase_min_s) < res.predicted_step_s * 0.99  # the relaxed floor is below
    assert math.isclose(b.floor_s, res.predicted_step_s, rel_tol=1e-9)
    monkeypatch.setattr(dp, "MEMORY_BOUND_POINTS", 0)
    assert math.isclose(search_plan(setup, CALIB).predicted_step_s, res.predicted_step_s,
                        rel_tol=1e-12)


def test_minimal_keeps_exactly_the_undominated_levels() -> None:
    levels = [(3.0, 5, 9), (1.0, 7, 7), (2.0, 7, 8), (2.0, 6, 9), (4.0, 5, 8), (1.0, 7, 7)]
    got = minimal_levels(list(levels))
    brute = sorted({lv for lv in levels if not any(
        o != lv and o[0] <= lv[0] and o[1] <= lv[1] and o[2] <= lv[2] for o in levels)})
    assert sorted(set(got)) == brute
