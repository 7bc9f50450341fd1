"""A plan change that keeps some model-stages' replicas, on 4 gloo ranks holding real
Megatron GPTModels (:func:`nereus.runtime.execution.plan_change.change_plan`).

A change that only re-splits the batch (smaller micro-batches, recomputation) moves nothing: the
transition DAG has no primitive, and the ranks keep every unit *and* every DP group — no
``dist.new_group`` (each one a gloo rendezvous of every rank of the job, what made such a change
take 0.4-1.6 s on a loaded host). A change that moves one model-stage keeps the DP groups of
the other. Either way every unit's state is bit-exact after it, and the kept DP groups still
all-reduce.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from support.dag_cases import SETUP, WORLD
from support.shard_cases import global_state

from nereus.spec.plan import ExecutionPlan, StagePlan

RUN_IDS = itertools.count()
TRAIN = StagePlan("actor-train", 2, 1, 2, 2, 2, replicas=((0, 1), (2, 3)))  # DP groups {0,2} {1,3}
GEN = StagePlan("actor-gen", 1, 1, 4, 2, 1, replicas=((0,), (1,), (2,), (3,)))
SOURCE = ExecutionPlan((TRAIN, GEN))
NO_MOVE = ExecutionPlan((StagePlan("actor-train", 2, 1, 2, 1, 4, recompute=True,
                                   replicas=TRAIN.replicas), GEN))
GEN_MOVES = ExecutionPlan((TRAIN, StagePlan("actor-gen", 2, 1, 2, 4, 1,
                                            replicas=((0, 1), (2, 3)))))


def _change(rank: int, world: int, store: Any, target: ExecutionPlan, run_id: int
            ) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from nereus.runtime.execution.plan_change import change_plan
    from nereus.runtime.worker.units import PlanUnits
    from nereus.transition.order import PlanChangeOrder
    from nereus.transition.planned import plan_transition

    globs = {"actor-train": global_state(1), "actor-gen": global_state(2)}
    units = PlanUnits(SETUP, SOURCE, rank, 30.0, 1e-3, globs, {}, store, f"keep{run_id}/p0")
    before = {name: {dp: st.snapshot() for dp, st in su.mine.items()}
              for name, su in units.stages.items()}
    dp_group = units.stages["actor-train"].dp_group
    groups_before = len(dist.distributed_c10d._world.pg_map)
    planned = plan_transition(SETUP, SOURCE, target)
    order = PlanChangeOrder.of(target, range(world), "urgent", planned, 1)
    new, change = change_plan(None, units, order, store, 1, lr=1e-3)
    train = new.stages["actor-train"]
    x = torch.full((3,), float(rank + 1))
    dist.all_reduce(x, group=train.dp_group)  # the kept group still works
    out = {"executor": change.executor, "primitives": len(change.primitives),
           "bytes": change.bytes_moved, "kept_dp": train.dp_group is dp_group,
           "new_groups": len(dist.distributed_c10d._world.pg_map) - groups_before,
           "micro_batch": train.plan.micro_batch, "sum": x.tolist(),
           "train_same": {dp: _same(before["actor-train"][dp], st.snapshot())
                          for dp, st in train.mine.items()},
           "gen": {dp: st.snapshot() for dp, st in new.stages["actor-gen"].mine.items()},
           "gen_before": before["actor-gen"]}
    new.destroy()
    return out


def _same(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> bool:
    return a.keys() == b.keys() and all(
        a[f].keys() == b[f].keys() and all((a[f][k] == b[f][k]).all() and a[f][k].dtype ==
                                           b[f][k].dtype for k in a[f]) for f in a)


@pytest.fixture
def pool() -> Any:
    from support.gloo_harness import shared_pool

    return shared_pool(WORLD)


def test_a_change_that_moves_nothing_keeps_units_and_groups(pool: Any) -> None:
    out = pool.run(_change, NO_MOVE, next(RUN_IDS))
    for rank, r in enumerate(out):
        assert (r["executor"], r["primitives"], r["bytes"]) == ("dag", 0, 0), r
        assert r["new_groups"] == 0 and r["kept_dp"], (rank, r["new_groups"])
        assert r["micro_batch"] == 1  # the new batch split is the plan the ranks run
        assert r["train_same"] and all(r["train_same"].values()), rank
        assert r["gen"].keys() == r["gen_before"].keys()
        assert all(_same(r["gen"][dp], r["gen_before"][dp]) for dp in r["gen"])
        partner = rank ^ 2  # DP groups {0, 2} and {1, 3}
        assert r["sum"] == [float(rank + 1 + partner + 1)] * 3


def test_a_change_of_one_model_stage_keeps_the_other_stages_dp_groups(pool: Any) -> None:
    out = pool.run(_change, GEN_MOVES, next(RUN_IDS))
    weights = global_state(2)["param"]
    for rank, r in enumerate(out):
        assert r["executor"] == "dag" and r["primitives"] > 0, r
        assert r["kept_dp"] and r["train_same"] and all(r["train_same"].values()), rank
        assert r["sum"] == [float(rank + 1 + (rank ^ 2) + 1)] * 3
        assert list(r["gen"]) == [rank // 2]  # actor-gen now tp 2 on {0, 1} and {2, 3}
    # actor-gen's weights reassembled from the new tp-2 shards equal the old ones bit for bit
    from nereus.emu.shards import shards_at
    from nereus.emu.unit import Layout

    for rank, r in enumerate(out):
        for s in shards_at(SETUP.job.model("actor"), Layout(2, 1), 0, rank % 2):
            arr = r["gen"][rank // 2]["param"][s.local_key]
            for pc in s.pieces:
                g = tuple(slice(a, b) for a, b in zip(pc.global_.start, pc.global_.stop,
                                                      strict=True))
                lo = tuple(slice(a, b) for a, b in zip(pc.local.start, pc.local.stop,
                                                       strict=True))
                assert (arr[lo] == weights[s.tensor][g]).all(), (rank, s.tensor)
