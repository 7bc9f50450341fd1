"""Tier 1 (pure): vendor-aware plans and transitions on mixed NVIDIA + AMD pools (issue 23).

Properties: no plan ever puts one TP×PP group across hardware types; every GPU holds at most its
own type's capacity; every transfer of a transition DAG between vendors is costed and marked as
the host transport, every transfer within one vendor is not.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereus.cluster.transport import HOST, RankPlacement, pair_transport
from nereus.config import parse_config
from nereus.cost.calibration import Calibration
from nereus.cost.memory import memory_capacity_bytes
from nereus.errors import InfeasiblePlanError, TransitionError
from nereus.plan.assign import placement_errors
from nereus.plan.explain import explain, plan_result_to_json
from nereus.plan.hetero import evaluate_plan, sub_workflow, type_errors, typed_setup
from nereus.plan.search import search_plan
from nereus.spec.hardware import H200, MI300X, OpClass
from nereus.spec.job import Setup
from nereus.transition import plan_transition
from nereus.transition.cost import transfer_links


def _setup(groups: list[tuple[int, str]], gpn: int = 4, model: str = "qwen2.5-0.5b",
           algorithm: str = "grpo", gen_len: int = 1024, batch: int = 64, **job: Any) -> Setup:
    models = {"actor": model}
    if algorithm == "ppo":
        models["critic"] = model
    raw = {"job": {"algorithm": algorithm, "global_batch": batch, "prompt_len": 512,
                   "gen_len": gen_len, "reward_model": False, **job},
           "models": models,
           "cluster": {"gpus_per_node": gpn,
                       "nodes": [{"count": c, "gpu": g} for c, g in groups]}}
    return parse_config(raw).setup


def _check_plan(setup: Setup, result: Any, pool: list[int] | None = None) -> None:
    cl = setup.cluster
    plan = result.plan
    assert type_errors(cl, plan) == []
    for sp in plan.stages:
        for rep in sp.replicas:  # one unit, one hardware type
            assert len({cl.type_name(g) for g in rep}) == 1, (sp.name, rep)
    assert placement_errors(setup, plan, pool if pool is not None else cl.all_gpus()) == []
    for g, b in result.gpu_peak_bytes:
        assert b <= memory_capacity_bytes(typed_setup(setup, cl.gpu_of(g))), g
    cost = evaluate_plan(setup, plan)
    assert cost.step_s == pytest.approx(result.predicted_step_s)
    assert not cost.over_capacity and not cost.type_errors


MIXES = st.sampled_from([
    [(1, "h200"), (1, "mi300x")], [(2, "h200"), (1, "mi300x")], [(1, "mi300x"), (2, "h200")],
    [(1, "a100-80gb"), (1, "h200"), (1, "mi300x")], [(1, "h100-80gb"), (1, "mi250x-gcd")],
    [(1, "h200"), (1, "mi300x"), (1, "h200")],  # interleaved: one type on nodes 0 and 2
])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mix=MIXES, gpn=st.sampled_from([2, 4, 8]),
       model=st.sampled_from(["qwen2.5-0.5b", "llama-3.1-8b"]),
       algorithm=st.sampled_from(["grpo", "ppo"]), mode=st.sampled_from(["sync", "async"]),
       drop=st.sets(st.integers(0, 31), max_size=6))
def test_no_plan_puts_a_unit_across_hardware_types(mix: list[tuple[int, str]], gpn: int,
                                                    model: str, algorithm: str, mode: str,
                                                    drop: set[int]) -> None:
    setup = _setup(mix, gpn, model, algorithm, mode=mode)
    pool = [g for g in setup.cluster.all_gpus() if g not in drop]
    try:
        result = search_plan(setup, pool=pool)
    except InfeasiblePlanError:
        return
    _check_plan(setup, result, pool)


MIX_LIST = [[(1, "h200"), (1, "mi300x")], [(2, "h200"), (1, "mi300x")],
            [(1, "mi300x"), (2, "h200")], [(1, "a100-80gb"), (1, "h200"), (1, "mi300x")],
            [(1, "h100-80gb"), (1, "mi250x-gcd")], [(1, "h200"), (1, "mi300x"), (1, "h200")],
            [(1, "a100-80gb"), (1, "h200")]]  # the last: two types, one vendor


def _cuda_placements(cl: Any) -> tuple[RankPlacement, ...]:
    """One CUDA-built rank per GPU of ``cl``: on its node, of its type's vendor, on its own
    device (what the runtime's binding gives a rank on a real mixed pool)."""
    gpn = cl.gpus_per_node
    return tuple(RankPlacement(g, f"n{g // gpn}", "cuda", cl.gpu_of(g).vendor,
                               f"{cl.gpu_of(g).vendor}:{g % gpn}") for g in cl.all_gpus())


def test_every_transfer_of_a_dag_is_costed_on_the_transport_the_runtime_would_pick() -> None:
    """A node of a mixed pool leaves, or comes back (its GPUs then receive new replicas from
    wherever the state is): every transfer's transport in the cost model (``transfer_links``)
    is what ``pair_transport`` picks for CUDA ranks placed on those GPUs, and it is costed at
    the host link exactly when it is the host transport. The cases are counted, so that the
    check cannot pass on transitions that move nothing: transfers across vendors (in several
    transitions) and within one vendor across hardware types both occur."""
    rng = random.Random(20261204)
    seen = {"cross-vendor": 0, "same-vendor": 0, "transitions crossing vendors": 0}
    for k in range(14):
        mix = MIX_LIST[k % len(MIX_LIST)]
        setup = _setup(mix, 4)
        cl = setup.cluster
        placed = _cuda_placements(cl)
        node = rng.randrange(cl.nodes)
        without = [g for g in cl.all_gpus() if g // cl.gpus_per_node != node]
        before, after = (without, list(cl.all_gpus())) if k % 2 else (cl.all_gpus(), without)
        try:
            current = search_plan(setup, pool=before).plan
            target = search_plan(setup, pool=after).plan
            planned = plan_transition(setup, current, target, after)
        except (InfeasiblePlanError, TransitionError):
            continue
        crossed = False
        for _, src, dst, transport, bps in transfer_links(planned.dag, cl):
            assert transport == pair_transport(placed[src], placed[dst]), (mix, src, dst)
            assert (bps == cl.host_gbps * 1e9) == (transport == HOST), (mix, src, dst, bps)
            crossed |= placed[src].vendor != placed[dst].vendor
            seen["cross-vendor" if placed[src].vendor != placed[dst].vendor
                 else "same-vendor"] += 1
        seen["transitions crossing vendors"] += crossed
    assert seen["transitions crossing vendors"] >= 3 and seen["same-vendor"] >= 1, seen


def test_cross_vendor_transition_is_costed_at_the_host_link() -> None:
    setup = _setup([(2, "h200"), (2, "mi300x")])
    cl = setup.cluster
    current = search_plan(setup).plan
    pool = list(range(4, 16))  # node 0 (h200) lost: state moves between vendors
    target = search_plan(setup, pool=pool).plan
    planned = plan_transition(setup, current, target, pool)
    links = transfer_links(planned.dag, cl)
    assert any(t == "host" for *_, t, _ in links)
    slower = type(cl)(cl.nodes, cl.gpus_per_node, cl.gpu, groups=cl.groups, host_gbps=1.0)
    assert plan_transition(setup.__class__(setup.job, slower), current, target,
                           pool).cost_s > planned.cost_s


def test_vendor_aware_plan_is_never_slower_than_either_type_alone() -> None:
    setup = _setup([(1, "h200"), (1, "mi300x")], 8, "llama-3.1-8b", "ppo")
    best = search_plan(setup)
    _check_plan(setup, best)
    for t in setup.cluster.types:
        alone = search_plan(typed_setup(setup, t), pool=setup.cluster.gpus_of(t))
        assert best.predicted_step_s <= alone.predicted_step_s + 1e-9


def test_generation_on_one_vendor_training_on_the_other_pays_a_host_weight_sync() -> None:
    # MI300X calibrated fast at decoding, H200 at GEMMs: generation goes to AMD, training to
    # NVIDIA, and the actor's weights cross vendors every step through the host transport.
    setup = _setup([(1, "h200"), (1, "mi300x")], 8, "llama-3.1-8b", gen_len=4096, batch=64,
                   samples_per_prompt=8)
    cal = (Calibration().with_time_sample(MI300X, OpClass.DECODE_MEMORY, 0.9, 1.0, 1.0)
           .with_time_sample(MI300X, OpClass.GEMM, 0.05, 1.0, 1.0)
           .with_time_sample(H200, OpClass.DECODE_MEMORY, 0.1, 1.0, 1.0))
    r = search_plan(setup, cal)
    cl = setup.cluster
    gen, train = r.plan.stage("actor-gen"), r.plan.stage("actor-train")
    assert {cl.type_name(g) for g in gen.gpus} == {"mi300x"}
    assert {cl.type_name(g) for g in train.gpus} == {"h200"}
    sync = next(s for s in r.stage_latencies if s.name == "actor-gen").component("weight_sync")
    params = setup.job.model("actor").num_params() * setup.job.dtype_bytes
    senders = min(len(train.gpus), len(gen.gpus))
    assert sync == pytest.approx(gen.dp * params / (senders * cl.host_gbps * 1e9))
    text = explain(r, setup, cal)
    assert "h200 (nvidia" in text and "mi300x (amd" in text and "weight sync" in text
    js = plan_result_to_json(r, setup)
    assert [t["gpu"] for t in js["types"]] == ["h200", "mi300x"]
    assert {s["name"]: s["hardware"] for s in js["model_stages"]}["actor-gen"] == ["mi300x"]


def test_replicas_span_types_only_when_the_cost_model_says_it_pays() -> None:
    # 8B GRPO training on one 8-GPU node of either type is slower than on both with the
    # gradient sync over the host: the planner spans. With a host link 10,000× slower it does
    # not.
    setup = _setup([(1, "h200"), (1, "mi300x")], 8, "llama-3.1-8b", gen_len=4096,
                   samples_per_prompt=8)
    cl = setup.cluster
    spans = search_plan(setup)
    _check_plan(setup, spans)
    train = spans.plan.stage("actor-train")
    assert {cl.type_name(g) for g in train.gpus} == {"h200", "mi300x"}
    slow = Setup(setup.job, type(cl)(cl.nodes, cl.gpus_per_node, cl.gpu, groups=cl.groups,
                                     host_gbps=cl.host_gbps / 1e4))
    kept = search_plan(slow)
    _check_plan(slow, kept)
    train = kept.plan.stage("actor-train")
    assert len({cl.type_name(g) for g in train.gpus}) == 1
    assert kept.predicted_step_s > spans.predicted_step_s


def test_sub_workflow_keeps_lanes_and_phases_of_its_model_stages() -> None:
    wf = _setup([(1, "h200"), (1, "mi300x")], algorithm="ppo").job.workflow
    sub = sub_workflow(wf, ("actor-gen", "critic-train"))
    assert sub.names == ("actor-gen", "critic-train")
    assert sub.lanes == ((("actor-gen",), ("critic-train",)),)


def test_homogeneous_plans_are_unchanged_by_node_groups() -> None:
    one = _setup([(2, "h200")])
    assert not one.cluster.heterogeneous and one.cluster.groups == ()
    r = search_plan(one)
    assert r.method == "dp" and type_errors(one.cluster, r.plan) == []


def test_nereus_plan_prints_the_placement_per_type(tmp_path: Any,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from nereus.cli import main

    path = tmp_path / "mixed.yaml"
    path.write_text("job: {algorithm: ppo, global_batch: 256, prompt_len: 1024, gen_len: 2048,"
                    " reward_model: false}\n"
                    "models: {actor: llama-3.1-8b, critic: llama-3.1-8b}\n"
                    "cluster: {gpus_per_node: 8, nodes: [{count: 1, gpu: h200},"
                    " {count: 1, gpu: mi300x}]}\n")
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "placement per hardware type" in out
    assert "  h200 (nvidia, 126.9 GB usable): 8 of 8 GPUs — " in out
    assert "  mi300x (amd, 172.8 GB usable): 8 of 8 GPUs — " in out
    assert main(["plan", str(path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert {t["gpu"] for t in got["types"]} == {"h200", "mi300x"}
    for stage in got["model_stages"]:
        for rep in stage["replicas"]:
            assert len({g // 8 for g in rep}) == 1  # a unit inside one node: one type
