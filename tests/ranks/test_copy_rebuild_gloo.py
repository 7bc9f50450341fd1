"""A frozen copy rebuilt from its source after the DAG, on gloo ranks holding real Megatron
GPTModels (:mod:`nereus.transition.rebuild`, :func:`nereus.runtime.execution.plan_change
.change_plan`).

actor-gen's every replica sits on node 1, actor-train keeps a replica on node 0; the pool
shrinks to node 0. The planner plans actor-train's change from its surviving replica — its DAG
(4 ranks), or on 8 ranks whose memory the DAG's Split does not fit, the host-staged change — and
rebuilds actor-gen from it; the order travels in its wire form, every rank (those leaving the
pool too: they take part in the new groups) runs it, and the units of the target are compared
bit for bit with those of a job that did not transition — the same target plan built from the
logical state, where actor-gen holds actor-train's parameters as after every weight sync.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from support.dag_cases import SETUP, WORLD
from support.shard_cases import global_state
from support.staged_cases import SETUP as STAGED
from support.staged_cases import TRAIN_BYTES

from nereus.spec.plan import ExecutionPlan, StagePlan

RUN_IDS = itertools.count()
NODE0 = (0, 1)
SOURCE = ExecutionPlan((StagePlan("actor-train", 2, 1, 2, 2, 2, replicas=((0, 1), (2, 3))),
                        StagePlan("actor-gen", 1, 1, 2, 2, 1, replicas=((2,), (3,)))))
TARGET = ExecutionPlan((StagePlan("actor-train", 1, 2, 1, 2, 4, replicas=((0, 1),)),
                        StagePlan("actor-gen", 1, 1, 2, 2, 1, replicas=((0,), (1,)))))
COUNTERS = (7, 2, 5, 11)
# 8 ranks (2 nodes of 4, tests/support/staged_cases.py's job) with room for 0.6 of actor-train's
# state per GPU: actor-train's (tp 1, pp 4) → (tp 2, pp 2) Split holds 3/4 of it on a GPU, so the
# change on node 0 is staged through host memory; the target (1/4 of actor-train, 1/6 beside
# it of actor-gen at tp 2) fits.
STAGED_SETUP = replace(STAGED, cluster=replace(STAGED.cluster, gpu=replace(
    STAGED.cluster.gpu, memory_bytes=int(0.6 * TRAIN_BYTES))))
STAGED_NODE0 = (0, 1, 2, 3)
STAGED_SOURCE = ExecutionPlan((
    StagePlan("actor-gen", 2, 1, 2, 1, 4, replicas=((4, 5), (6, 7))),
    StagePlan("actor-train", 1, 4, 2, 1, 4, replicas=(STAGED_NODE0, (4, 5, 6, 7)))))
STAGED_TARGET = ExecutionPlan((
    StagePlan("actor-gen", 2, 1, 2, 1, 4, replicas=((0, 1), (2, 3))),
    StagePlan("actor-train", 2, 2, 1, 1, 8, replicas=(STAGED_NODE0,))))


def _globs() -> dict[str, Any]:
    train = global_state(1)
    return {"actor-train": train, "actor-gen": {f: {k: (a if f == "param" else a * 0)
                                                    for k, a in train["param"].items()}
                                                for f in train}}


def _snap(units: Any) -> dict[str, Any]:
    return {name: {dp: (st.snapshot(), tuple(vars(st.counters).values()), st.step_value())
                   for dp, st in su.mine.items()} for name, su in units.stages.items()}


def _change(rank: int, world: int, store: Any, wire: dict[str, Any], run_id: int,
            staged: bool = False) -> dict[str, Any]:
    from nereus.runtime.execution.plan_change import change_plan
    from nereus.runtime.worker.state import Counters
    from nereus.runtime.worker.units import PlanUnits
    from nereus.transition.order import PlanChangeOrder

    setup, source = (STAGED_SETUP, STAGED_SOURCE) if staged else (SETUP, SOURCE)
    counters = {"actor-train": (Counters(*COUNTERS), 3.0)}
    units = PlanUnits(setup, source, rank, 30.0, 1e-3, _globs(), counters, store,
                      f"rebuild{run_id}/p0")
    order = PlanChangeOrder.from_wire(wire)
    new, change = change_plan(None, units, order, store, 1, lr=1e-3)
    got = _snap(new)
    new.destroy()
    # the job that did not transition: the target built from the logical state
    ref = PlanUnits(setup, order.target, rank, 30.0, 1e-3, _globs(), counters, store,
                    f"rebuild{run_id}/ref")
    want = _snap(ref)
    ref.destroy()
    return {"executor": change.executor, "reason": change.reason, "bytes": change.bytes_moved,
            "got": got, "want": want}


def _same(a: Any, b: Any) -> bool:
    (sa, ca, xa), (sb, cb, xb) = a, b
    return ca == cb and xa == xb and sa.keys() == sb.keys() and all(
        sa[f].keys() == sb[f].keys() and all((sa[f][k] == sb[f][k]).all()
                                             and sa[f][k].dtype == sb[f][k].dtype
                                             for k in sa[f]) for f in sa)


@pytest.fixture
def pool() -> Any:
    from support.gloo_harness import shared_pool

    return shared_pool(WORLD)


def test_a_lost_copy_is_rebuilt_from_its_source_bit_exact(pool: Any) -> None:
    from nereus.transition.change import plan_change
    from nereus.transition.order import PlanChangeOrder

    planned = plan_change(SETUP, SOURCE, TARGET, NODE0)
    assert planned.executor == "dag" and [r.model_stage for r in planned.rebuilt] == [
        "actor-gen"]
    wire = PlanChangeOrder.of(TARGET, NODE0, "urgent", planned, 1).to_wire()
    out = pool.run(_change, wire, next(RUN_IDS))
    for rank, r in enumerate(out):
        assert r["executor"] == "dag" and "actor-gen" in r["reason"], r["reason"]
        if rank not in NODE0:  # left the pool: holds nothing of the target
            assert not any(r["got"][n] for n in r["got"]) and not any(
                r["want"][n] for n in r["want"]), rank
            continue
        assert r["got"].keys() == r["want"].keys() == {"actor-train", "actor-gen"}
        for name in r["want"]:
            assert r["got"][name].keys() == r["want"][name].keys(), (rank, name)
            for dp in r["want"][name]:
                assert _same(r["got"][name][dp], r["want"][name][dp]), (rank, name, dp)
        assert r["bytes"] > 0
    # actor-gen's counters are a copy's (never trained), actor-train's carried over
    assert out[0]["got"]["actor-gen"][0][1] == (0, 0, 0, 0)
    assert out[0]["got"]["actor-train"][0][1] == COUNTERS


def test_a_lost_copy_is_rebuilt_after_a_host_staged_change_bit_exact() -> None:
    from support.gloo_harness import shared_pool

    from nereus.transition.change import plan_change
    from nereus.transition.order import PlanChangeOrder

    planned = plan_change(STAGED_SETUP, STAGED_SOURCE, STAGED_TARGET, STAGED_NODE0)
    assert planned.executor == "staged" and planned.staged is not None
    assert planned.staged.names == ("actor-train",)
    assert [r.model_stage for r in planned.rebuilt] == ["actor-gen"]
    wire = PlanChangeOrder.of(STAGED_TARGET, STAGED_NODE0, "urgent", planned, 1).to_wire()
    # 8 ranks spawned on a shared 2-core machine: a generous limit
    out = shared_pool(8).run(_change, wire, next(RUN_IDS), True, timeout_s=600.0)
    for rank, r in enumerate(out):
        assert r["executor"] == "staged" and "actor-gen" in r["reason"], r["reason"]
        assert r["got"].keys() == r["want"].keys()
        for name in r["want"]:
            assert r["got"][name].keys() == r["want"][name].keys(), (rank, name)
            assert bool(r["want"][name]) == (rank in STAGED_NODE0), (rank, name)
            for dp in r["want"][name]:
                assert _same(r["got"][name][dp], r["want"][name][dp]), (rank, name, dp)
