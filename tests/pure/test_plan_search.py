"""Pure core: plan search (candidates, frontier, DP, exact references, explanation)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support.plan_cases import CALIB, llama_setup, pools, problem_of, random_feasible_choice, setups

from nereus.cost.latency import stage_latency
from nereus.cost.memory import gpu_memory, memory_capacity_bytes, rank_memory, stage_memory
from nereus.errors import ConfigError, InfeasiblePlanError
from nereus.plan import dp
from nereus.plan.assign import assign, placement_errors
from nereus.plan.candidates import (
    CostCache,
    dominates,
    enumerate_candidates,
    frontier,
    pipeline_depths,
    stage_sequences,
)
from nereus.plan.exhaustive import SearchLimitError
from nereus.plan.explain import explain, infeasible_to_json, plan_result_to_json
from nereus.plan.problem import memory_bound_bytes, step_s
from nereus.plan.search import PlanResult, search_plan
from nereus.spec.hardware import A100_64GB, H200, ClusterSpec, GpuSpec
from nereus.spec.job import JobSpec, PlanSpace, Setup
from nereus.spec.model import (
    LLAMA_3_1_8B,
    LLAMA_3_3_70B,
    MEDIUM_GPT,
    TINY_GPT,
    stage_layer_counts,
)
from nereus.spec.plan import Candidate
from nereus.spec.workflow import Workflow

# the space nereus run searched before issue 37: pp dividing the layers, dp the batch
EVEN_SPACE = PlanSpace(pipeline="even", uneven_dp=False)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_result(setup: Setup, pool: tuple[int, ...], res: PlanResult) -> None:
    """Everything a returned plan must satisfy, checked independently of the search."""
    wf: Workflow = setup.job.workflow
    cap = memory_capacity_bytes(setup)
    per_gpu = gpu_memory(setup, res.plan, CALIB)
    assert max(per_gpu.values()) <= cap
    assert res.peak_memory_bytes == max(per_gpu.values()) and res.capacity_bytes == cap
    assert placement_errors(setup, res.plan, pool) == []
    gpn = setup.cluster.gpus_per_node
    for sp in res.plan.stages:
        ms = wf.by_name(sp.name)
        seqs = stage_sequences(setup, ms)
        share = -(-seqs // sp.dp)  # the largest share
        if ms.kind == "generate" and setup.job.space.uneven_dp:  # the last round may be partial
            assert sp.micro_batch * (sp.grad_accum - 1) < share <= sp.micro_batch * sp.grad_accum
        else:
            assert sp.micro_batch * sp.grad_accum == share
        assert setup.job.space.uneven_dp or sp.dp * sp.micro_batch * sp.grad_accum == seqs
        assert len(sp.replicas) == sp.dp
        for rep in sp.replicas:
            assert len(set(rep)) == sp.tp * sp.pp and set(rep) <= set(pool)
            for r in range(sp.pp):
                assert len({g // gpn for g in rep[r * sp.tp:(r + 1) * sp.tp]}) == 1
    # concurrent model-stages (same phase, or different lanes) on disjoint GPUs
    for a in res.plan.stages:
        for b in res.plan.stages:
            if wf.concurrent(a.name, b.name):
                assert not set(a.gpus) & set(b.gpus), (a.name, b.name)
    # GPU budget: Σ over lanes of the largest phase ≤ pool
    need = sum(max(sum(res.plan.stage(n).num_gpus for n in ph) for ph in lane) for lane in wf.lanes)
    assert need <= len(pool)
    assert math.isclose(
        res.predicted_step_s,
        max(sum(max(s.total_s for s in res.stage_latencies if s.name in ph) for ph in lane)
            for lane in wf.lanes),
        rel_tol=1e-12,
    )


@SETTINGS
@given(data=st.data())
def test_returned_plan_is_feasible_or_error_names_a_constraint(data: st.DataObject) -> None:
    setup = data.draw(setups())
    pool = data.draw(pools(setup))
    try:
        res = search_plan(setup, CALIB, pool=pool)
    except InfeasiblePlanError as exc:
        assert exc.reason and ("needs" in exc.reason or "GPU" in exc.reason or "pool" in exc.reason)
        return
    check_result(setup, pool, res)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_memory_bound_covers_gpu_memory_of_any_placed_choice(data: st.DataObject) -> None:
    """Soundness of the co-residency bound for arbitrary (not only optimal) choices."""
    setup = data.draw(setups())
    pool = data.draw(pools(setup))
    try:
        problem = problem_of(setup, pool)
    except InfeasiblePlanError:
        return
    choice = random_feasible_choice(problem, data.draw(st.integers(0, 10**6)))
    assume(choice is not None)
    assert choice is not None
    plan = assign(setup, {n: c.cand for n, c in choice.items()}, pool)
    assert placement_errors(setup, plan, pool) == []
    bound = memory_bound_bytes(problem, choice)
    assert max(gpu_memory(setup, plan, CALIB).values()) <= bound


def _small_space(setup: Setup, pool: tuple[int, ...]) -> bool:
    try:
        problem = problem_of(setup, pool)
    except InfeasiblePlanError:
        return True
    size = 1
    for s in problem.spaces:
        size *= max(1, len(s.feasible))
    return size <= 30_000


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.filter_too_much])
@given(data=st.data())
def test_dp_equals_exhaustive_on_small_instances(data: st.DataObject) -> None:
    tight = data.draw(st.booleans())  # memory where co-residency often binds
    setup = data.draw(setups(max_nodes=2, gpus_per_node=(1, 2, 4), max_batch=4,
                             memory_factors=(1.0, 1.4) if tight else None))
    pool = data.draw(pools(setup))
    assume(_small_space(setup, pool))
    try:
        ex = search_plan(setup, CALIB, pool=pool, method="exhaustive", time_limit_s=10)
    except SearchLimitError:
        assume(False)
        return
    except InfeasiblePlanError:
        with pytest.raises(InfeasiblePlanError):
            search_plan(setup, CALIB, pool=pool)
        return
    res = search_plan(setup, CALIB, pool=pool)
    assert math.isclose(res.predicted_step_s, ex.predicted_step_s, rel_tol=1e-9)
    check_result(setup, pool, ex)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_dp_equals_milp(data: st.DataObject) -> None:
    pytest.importorskip("scipy.optimize")
    setup = data.draw(setups(max_nodes=4, gpus_per_node=(2, 4, 8), max_batch=16))
    pool = data.draw(pools(setup))
    try:
        res = search_plan(setup, CALIB, pool=pool)
    except InfeasiblePlanError:
        with pytest.raises(InfeasiblePlanError):
            search_plan(setup, CALIB, pool=pool, method="milp", time_limit_s=30)
        return
    milp = search_plan(setup, CALIB, pool=pool, method="milp", time_limit_s=30)
    check_result(setup, pool, milp)
    assert res.predicted_step_s <= milp.predicted_step_s * (1 + 1e-9)
    assert milp.predicted_step_s <= res.predicted_step_s * (1 + 1e-4)


@SETTINGS
@given(data=st.data())
def test_more_gpus_never_give_a_slower_optimum(data: st.DataObject) -> None:
    setup = data.draw(setups())
    small = data.draw(pools(setup))
    extra = data.draw(st.sets(st.integers(0, setup.cluster.num_gpus - 1)))
    big = tuple(sorted(set(small) | extra))
    try:
        res_small = search_plan(setup, CALIB, pool=small)
    except InfeasiblePlanError:
        return
    res_big = search_plan(setup, CALIB, pool=big)
    assert res_big.predicted_step_s <= res_small.predicted_step_s * (1 + 1e-12)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_results_are_deterministic(data: st.DataObject) -> None:
    setup = data.draw(setups())
    pool = data.draw(pools(setup))
    try:
        a = search_plan(setup, CALIB, pool=pool)
    except InfeasiblePlanError as exc:
        with pytest.raises(InfeasiblePlanError) as again:
            search_plan(setup, CALIB, pool=pool)
        assert again.value.reason == exc.reason
        return
    b = search_plan(setup, CALIB, pool=pool, cache=CostCache())
    assert a == b
    # a cache filled on another pool (a replan after a pool change) gives the same result
    cache = CostCache()
    search_plan(setup, CALIB, cache=cache)
    assert search_plan(setup, CALIB, pool=pool, cache=cache) == a
    shuffled = tuple(reversed(pool))
    assert search_plan(setup, CALIB, pool=shuffled) == a


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_vectorized_frontier_equals_the_reference(data: st.DataObject) -> None:
    """The array frontier (pre-pruning, chunks, prefix-minimum table) keeps exactly the records,
    in the same order, that the plain pairwise ``frontier`` keeps."""
    setup = data.draw(setups(max_nodes=4, gpus_per_node=(2, 4, 8), max_batch=64))
    for ms in setup.job.workflow.model_stages:
        table = CostCache().table(setup, ms, CALIB)
        assert tuple(table.front) == frontier(table.feasible)
        # every candidate the table holds is costed as the one-row scalar model costs it
        for c in table.feasible[:: max(1, len(table.feasible) // 7)]:
            assert c.latency == stage_latency(setup, ms, c.cand, CALIB)
            assert c.memory == stage_memory(setup, ms, c.cand, CALIB)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_frontier_holds_a_dominator_of_every_feasible_candidate(data: st.DataObject) -> None:
    setup = data.draw(setups())
    pool = data.draw(pools(setup))
    try:
        problem = problem_of(setup, pool)
    except InfeasiblePlanError:
        return
    for space in problem.spaces:
        front = space.front
        assert set(front) <= set(space.feasible)
        for c in space.feasible:
            assert any(dominates(f, c) for f in front)


@pytest.mark.parametrize("space", [PlanSpace(), EVEN_SPACE])
def test_candidates_follow_the_plan_space_rules(space: PlanSpace) -> None:
    base = llama_setup(4, global_batch=96)
    setup = replace(base, job=replace(base.job, space=space))
    wf = setup.job.workflow
    depths = pipeline_depths(32, space.pipeline)
    assert set(depths) >= {1, 2, 4, 8, 16, 32}
    assert (3 in depths) == (space.pipeline == "uneven")  # 11, 11, 10 layers
    for ms in wf.model_stages:
        cands = enumerate_candidates(setup, ms, 32)
        assert cands
        seqs = stage_sequences(setup, ms)
        for c in cands:
            assert c.tp in (1, 2, 4, 8) and c.pp in depths
            size = c.tp * c.pp
            assert (size <= 8 and size & (size - 1) == 0) or size % 8 == 0
            share = -(-seqs // c.dp)
            assert c.num_gpus <= 32
            if ms.kind == "generate" and space.uneven_dp:  # rounds of b, the last one partial
                assert c.micro_batch * (c.grad_accum - 1) < share <= c.micro_batch * c.grad_accum
            else:
                assert c.micro_batch * c.grad_accum == share
            assert space.uneven_dp or c.dp * c.micro_batch * c.grad_accum == seqs
            assert c.recompute is False or ms.trainable
        dps = {c.dp for c in cands}
        assert dps >= {1, 2, 3, 4, 6, 8, 12, 16, 24, 32}
        if space.uneven_dp:  # one degree per largest share: 5 replicas of ≤ 20 of 96, not 6
            assert 5 in dps and 31 not in dps  # ⌈96/31⌉ = 4 = ⌈96/24⌉
        else:
            assert dps == {d for d in range(1, 33) if seqs % d == 0}
        assert any(c.recompute for c in cands) == ms.trainable


@pytest.mark.parametrize("layers,pp", [(96, 12), (105, 35), (126, 16)])
def test_planner_accepts_non_power_of_two_pipelines(layers: int, pp: int) -> None:
    """Issue 20: pp 12 for a 96-layer model, pp 35 for a 105-layer one (and Megatron's uneven
    16-stage split of 126 layers) are planned when memory allows, with the real layer counts."""
    model = replace(LLAMA_3_1_8B, name=f"llama-{layers}", num_layers=layers, vocab_size=32000)
    job = JobSpec(algorithm="ppo", mode="sync",
                  models=(("actor", model), ("critic", model), ("reference", model)),
                  global_batch=64, prompt_len=512, gen_len=512, reward_model=False)
    setup = Setup(job, ClusterSpec(pp + 4, 8, H200))  # room for the concurrent critic-train
    assert pp in pipeline_depths(layers, "uneven")
    assert (pp in pipeline_depths(layers, "even")) == (layers % pp == 0)
    res = search_plan(setup, CALIB, layouts={"actor-train": (8, pp)})
    sp = res.plan.stage("actor-train")
    assert (sp.tp, sp.pp) == (8, pp)
    check_result(setup, setup.cluster.all_gpus(), res)
    counts = stage_layer_counts(layers, pp)
    assert sum(counts) == layers and max(counts) == -(-layers // pp)
    ms = setup.job.workflow.by_name("actor-train")
    ranks = [rank_memory(setup, ms, sp.candidate, CALIB, r) for r in range(pp)]
    per_layer = LLAMA_3_1_8B.layer_params() // 8
    for r, mb in enumerate(ranks):  # the weights follow the real layer counts
        assert abs(mb.weights_bytes // 2 - counts[r] * per_layer) <= per_layer + 32000 * 4096 // 8


def test_llama_8b_ppo_plans_and_matches_milp_at_64_gpus() -> None:
    setup = llama_setup(8, gen_len=4096, global_batch=256)
    res = search_plan(setup, CALIB)
    check_result(setup, setup.cluster.all_gpus(), res)
    pytest.importorskip("scipy.optimize")
    milp = search_plan(setup, CALIB, method="milp", time_limit_s=60)
    assert math.isclose(res.predicted_step_s, milp.predicted_step_s, rel_tol=1e-6)


@pytest.mark.parametrize("nodes,gen_len", [(1, 1024), (2, 2048)])
def test_binding_co_residency_matches_milp(nodes: int, gen_len: int) -> None:
    """Llama-3.1-8B PPO on A100-64GB: the co-residency bound binds (the plan that ignores it is
    faster but not allowed) and the DP still equals the MILP."""
    setup = llama_setup(nodes, gen_len=gen_len, global_batch=256, gpu=A100_64GB)
    problem = problem_of(setup, setup.cluster.all_gpus())
    relaxed = dp.solve(replace(problem, capacity_bytes=10**18))
    assert relaxed is not None
    res = search_plan(setup, CALIB)
    check_result(setup, setup.cluster.all_gpus(), res)
    assert res.predicted_step_s > step_s(problem, relaxed) * 1.01
    pytest.importorskip("scipy.optimize")
    milp = search_plan(setup, CALIB, method="milp", time_limit_s=60)
    assert math.isclose(res.predicted_step_s, milp.predicted_step_s, rel_tol=1e-6)


def test_async_lanes_get_disjoint_gpus() -> None:
    setup = llama_setup(4, mode="async")
    res = search_plan(setup, CALIB)
    check_result(setup, setup.cluster.all_gpus(), res)
    gen = set(res.plan.stage("actor-gen").gpus)
    rest = {g for sp in res.plan.stages if sp.name != "actor-gen" for g in sp.gpus}
    assert gen and rest and not gen & rest


def test_70b_on_four_gpus_names_the_tightest_constraint() -> None:
    m = LLAMA_3_3_70B
    job = JobSpec(algorithm="ppo", mode="sync",
                  models=(("actor", m), ("critic", m), ("reference", m)),
                  global_batch=256, prompt_len=1024, gen_len=4096, reward_model=False)
    with pytest.raises(InfeasiblePlanError) as exc:
        search_plan(Setup(job, ClusterSpec(1, 4, H200)), CALIB)
    reason = exc.value.reason
    assert reason.startswith("actor-train needs ") and "GB per GPU at tp≤4" in reason
    assert "capacity 126.9 GB" in reason
    assert infeasible_to_json(reason) == {"feasible": False, "reason": reason}


def test_gpu_budget_shortage_is_named() -> None:
    """Every model-stage fits one GPU alone, but ref-inf and critic-inf need disjoint GPUs."""
    job = JobSpec(algorithm="ppo", mode="sync",
                  models=(("actor", TINY_GPT), ("critic", TINY_GPT), ("reference", TINY_GPT)),
                  global_batch=4, prompt_len=16, gen_len=16, reward_model=False)
    with pytest.raises(InfeasiblePlanError) as exc:
        search_plan(Setup(job, ClusterSpec(1, 1, H200)), CALIB)
    assert exc.value.reason.startswith("GPU budget: ")
    assert "need at least 2 GPUs" in exc.value.reason and "the pool has 1" in exc.value.reason
    assert search_plan(Setup(job, ClusterSpec(1, 2, H200)), CALIB).plan is not None


def test_co_residency_shortage_is_named() -> None:
    """GRPO on one GPU: each model-stage fits alone, their persistent state together does not."""
    job = JobSpec(algorithm="grpo", mode="sync",
                  models=(("actor", MEDIUM_GPT), ("reference", MEDIUM_GPT)),
                  global_batch=4, prompt_len=64, gen_len=64, reward_model=False)
    gpu = GpuSpec(name="t", vendor="cpu", memory_bytes=1_700_000_000, peak_flops=1e12,
                  hbm_gbps=100.0, intra_node_gbps=10.0, inter_node_gbps=1.0)
    with pytest.raises(InfeasiblePlanError) as exc:
        search_plan(Setup(job, ClusterSpec(1, 1, gpu)), CALIB)
    assert exc.value.reason.startswith("co-resident model-stages (actor-gen, ref-inf, actor-train)")
    roomy = replace(gpu, memory_bytes=2_500_000_000)
    res = search_plan(Setup(job, ClusterSpec(1, 1, roomy)), CALIB)
    check_result(Setup(job, ClusterSpec(1, 1, roomy)), (0,), res)


def test_bad_arguments_are_config_errors() -> None:
    setup = llama_setup(1)
    with pytest.raises(ConfigError):
        search_plan(setup, CALIB, method="greedy")
    with pytest.raises(ConfigError):
        search_plan(setup, CALIB, pool=(0, 8))
    with pytest.raises(ConfigError):
        search_plan(setup, CALIB, pool=(1, 1))
    with pytest.raises(InfeasiblePlanError):
        search_plan(setup, CALIB, pool=())


def test_explanation_and_json() -> None:
    setup = llama_setup(4)
    res = search_plan(setup, CALIB)
    text = explain(res, setup)
    assert "critical path" in text and "actor-train" in text and "adam" in text
    doc = plan_result_to_json(res)
    assert doc["feasible"] is True and doc["predicted_step_s"] == res.predicted_step_s
    assert doc["peak_memory_bytes"] == res.peak_memory_bytes
    rows = {r["name"]: r for r in doc["model_stages"]}
    assert set(rows) == set(setup.job.workflow.names)
    for sp in res.plan.stages:
        r = rows[sp.name]
        assert (r["tp"], r["pp"], r["dp"], r["gpus"]) == (sp.tp, sp.pp, sp.dp, list(sp.gpus))


def test_exhaustive_stops_at_its_work_limit() -> None:
    setup = llama_setup(4)
    with pytest.raises(SearchLimitError):
        search_plan(setup, CALIB, method="exhaustive", time_limit_s=1e-4)


def test_pinned_layouts_are_kept() -> None:
    setup = llama_setup(4)
    res = search_plan(setup, CALIB, layouts={"actor-train": (8, 1), "actor-gen": (2, 1)})
    assert (res.plan.stage("actor-train").tp, res.plan.stage("actor-train").pp) == (8, 1)
    assert (res.plan.stage("actor-gen").tp, res.plan.stage("actor-gen").pp) == (2, 1)
    free = search_plan(setup, CALIB)
    assert free.predicted_step_s <= res.predicted_step_s


def test_generation_rounds_follow_the_kv_capacity_in_the_uneven_space() -> None:
    """12 prompts per replica: the uneven space also decodes 8 at a time (2 rounds, the second
    partial) where the KV cache of 12 may not fit; the runtime's space keeps divisors."""
    base = llama_setup(1, global_batch=96)
    ms = base.job.workflow.by_name("actor-gen")
    for space, want in ((PlanSpace(), {1, 2, 4, 8, 12}), (EVEN_SPACE, {1, 2, 4, 12})):
        setup = replace(base, job=replace(base.job, space=space))
        got = {(c.micro_batch, c.grad_accum) for c in enumerate_candidates(setup, ms, 8)
               if (c.tp, c.pp, c.dp) == (1, 1, 8)}
        assert {b for b, _ in got} == want
        assert all(a == -(-12 // b) for b, a in got)
    uneven = replace(base, job=replace(base.job, space=PlanSpace()))
    eight, twelve = Candidate(ms.name, 1, 1, 8, 8, 2), Candidate(ms.name, 1, 1, 8, 12, 1)
    mem8 = stage_memory(uneven, ms, eight, CALIB).kv_cache_bytes
    assert mem8 * 12 == stage_memory(uneven, ms, twelve, CALIB).kv_cache_bytes * 8
    # two rounds of 8 cost more than one of 12 (memory-bound decode: weights read per round)
    assert stage_latency(uneven, ms, eight, CALIB).total_s > stage_latency(uneven, ms, twelve, CALIB).total_s
    for setup, bad in ((uneven, Candidate(ms.name, 1, 1, 8, 8, 1)),  # 8 < 12: does not cover
                       (replace(base, job=replace(base.job, space=EVEN_SPACE)), eight)):
        with pytest.raises(ConfigError):
            stage_latency(setup, ms, bad, CALIB)
