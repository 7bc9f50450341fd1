"""Tier 1 (pure): the memory batches of co-resident model-stages (:mod:`memory_order`) and the
compiler's fallback to phase ordering where a batch cannot fit."""

from __future__ import annotations

import pytest
from support.coresident_cases import coresident_case, run_schedule

from nereus.emu.primitives import Destroy, Extend
from nereus.emu.unit import Emu, Layout
from nereus.errors import TransitionError
from nereus.spec.workflow import build_workflow
from nereus.transition.reference import compile as compile_mod
from nereus.transition.reference.compile import compile_plans, compile_transition
from nereus.transition.validate import validate_dag

PPO = build_workflow("ppo", "sync", reward_model=True)
SIZE = {"actor-gen": 100, "critic-inf": 100, "actor-train": 100}


def _three_senders(cap: int):  # type: ignore[no-untyped-def]
    """Three co-resident model-stages leave GPU 0 (100 bytes each, 300 held): each Extend's
    sender holds its shard twice while it sends."""
    src = [Emu(m, m, Layout(1, 1), (0,)) for m in SIZE]
    tgt = [Emu(m, m, Layout(1, 1), (k + 1,)) for k, m in enumerate(SIZE)]
    dag = compile_transition(src, tgt, SIZE.__getitem__, capacity_bytes=cap,
                             conflicts=PPO.concurrent)
    return dag, tgt


def test_senders_that_fit_two_at_a_time_run_in_batches_of_two() -> None:
    dag, tgt = _three_senders(500)  # 300 held + 100 per running send: two at a time
    ext = {p.model_stage: i for i, p in enumerate(dag.primitives) if isinstance(p, Extend)}
    memory = {(a, b) for a, b, k in dag.edges if k == "memory"}
    # level order, ties by index (gen → inf → train): the first two sends share a batch, the
    # third follows both; the Destroys only free bytes and wait for nobody
    assert memory == {(ext["actor-gen"], ext["actor-train"]),
                      (ext["critic-inf"], ext["actor-train"])}
    assert not any(isinstance(dag.primitives[b], Destroy) for _, b in memory)
    validate_dag(dag, capacity_bytes=500)
    with pytest.raises(TransitionError, match="600 bytes on GPU 0"):
        validate_dag(dag.without(("memory",)), capacity_bytes=500)
    assert run_schedule(dag, 500, SIZE, PPO.concurrent).live == set(tgt)
    # one at a time where only one fits, none where all three do
    one, _ = _three_senders(400)
    ext1 = {p.model_stage: i for i, p in enumerate(one.primitives) if isinstance(p, Extend)}
    assert {(a, b) for a, b, k in one.edges if k == "memory"} == {
        (ext1["actor-gen"], ext1["critic-inf"]), (ext1["critic-inf"], ext1["actor-train"])}
    validate_dag(one, capacity_bytes=400)
    free, _ = _three_senders(600)
    assert not [k for _, _, k in free.edges if k == "memory"]


def test_the_priority_order_is_recomputed_over_the_memory_edges() -> None:
    dag, _ = _three_senders(500)
    pos = {i: k for k, i in enumerate(dag.order)}
    assert sorted(dag.order) == list(range(len(dag.primitives)))
    assert all(pos[a] < pos[b] for a, b, _ in dag.edges)


def test_where_a_batch_cannot_fit_phases_are_ordered_instead(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Random co-resident plans with tight capacities: some need the fallback, and its DAG is
    valid too (the property tests cover both paths; this pins that both are taken)."""
    outcomes: list[bool] = []
    real = compile_mod.memory_batches

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        edges, over = real(*args, **kwargs)
        outcomes.append(over is None)
        return edges, over

    monkeypatch.setattr(compile_mod, "memory_batches", spy)
    fell_back = batched = 0
    for seed in range(120):
        case = coresident_case(seed)
        before = len(outcomes)
        try:
            dag = compile_plans(case.current, case.target, case.states, case.sizer,
                                capacity_bytes=case.capacity_bytes,
                                conflicts=case.workflow.concurrent, spare_gpus=case.pool)
        except TransitionError:
            continue
        if len(outcomes) == before:
            continue  # no GPU over its bound: no memory ordering at all
        validate_dag(dag, capacity_bytes=case.capacity_bytes, sizer=case.sizer)
        if outcomes[-1]:
            batched += 1
        else:
            fell_back += 1
    assert batched >= 5 and fell_back >= 1, (batched, fell_back)
