"""A frozen copy of a trained model-stage (actor-gen of actor-train, critic-inf of
critic-train) whose every replica is lost comes back from a replica of its source: the planner
plans the DAG of the rest and rebuilds the copy from its source's target units
(:mod:`nereus.transition.rebuild`) — no gather-and-reload, so also where the whole state does not
fit a rank's host memory; a trained model-stage, or a copy whose source is lost too, still needs
the checkpoint."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.staged_cases import SETUP

from nereus.emu.unit import emus_of_plan
from nereus.errors import TransitionError
from nereus.spec.plan import ExecutionPlan, StagePlan
from nereus.spec.workflow import build_workflow
from nereus.transition.change import plan_change
from nereus.transition.fallbacks import gather_reload_blocker
from nereus.transition.order import PlanChangeOrder
from nereus.transition.planned import stage_states
from nereus.transition.rebuild import plan_rebuild, rebuild_s

NODE0, NODE1 = (0, 1, 2, 3), (4, 5, 6, 7)
GEN_ON_1 = StagePlan("actor-gen", 2, 1, 2, 1, 4, replicas=((4, 5), (6, 7)))
TRAIN_ON_BOTH = StagePlan("actor-train", 1, 4, 2, 1, 4, replicas=(NODE0, NODE1))
TRAIN_ON_1 = StagePlan("actor-train", 1, 4, 1, 1, 8, replicas=(NODE1,))
TARGET = ExecutionPlan((StagePlan("actor-gen", 2, 1, 2, 1, 4, replicas=((0, 1), (2, 3))),
                        StagePlan("actor-train", 1, 4, 1, 1, 8, replicas=(NODE0,))))


def test_copy_sources_follow_the_shared_state() -> None:
    wf = build_workflow("ppo")
    assert wf.copy_source("actor-gen") == "actor-train"
    assert wf.copy_source("critic-inf") == "critic-train"
    assert wf.copy_source("ref-inf") is None and wf.copy_source("actor-train") is None
    assert wf.lost_stages({"actor-gen": False, "actor-train": True}) == []
    assert wf.lost_stages({"actor-gen": False, "actor-train": False}) == ["actor-gen",
                                                                          "actor-train"]
    assert wf.lost_stages({"ref-inf": False, "actor-train": True}) == ["ref-inf"]


def test_a_lost_copy_whose_source_survives_is_rebuilt_after_the_dag() -> None:
    current = ExecutionPlan((GEN_ON_1, TRAIN_ON_BOTH))
    planned = plan_change(SETUP, current, TARGET, NODE0)
    assert planned.executor == "dag" and not planned.restart_reason
    (rb,) = planned.rebuilt
    assert (rb.model_stage, rb.source) == ("actor-gen", "actor-train")
    assert rb.targets == tuple(u for u in emus_of_plan(TARGET, stage_states(SETUP))
                               if u.model_stage == "actor-gen")
    assert all(u.model_stage == "actor-train" and u.gpus == NODE0 for u in rb.feeds)
    # the DAG is that of the rest: actor-train alone, from its surviving replica
    dag = planned.dag
    assert {u.model_stage for u in (*dag.source, *dag.target)} == {"actor-train"}
    assert dag.source == tuple(u for u in emus_of_plan(current, stage_states(SETUP))
                               if u.model_stage == "actor-train" and u.gpus == NODE0)
    rest = plan_change(SETUP, ExecutionPlan((TRAIN_ON_BOTH,)),
                       ExecutionPlan((TARGET.stages[1],)), NODE0)
    assert planned.cost_s == pytest.approx(rest.cost_s + rebuild_s(SETUP, planned.rebuilt))
    assert rebuild_s(SETUP, planned.rebuilt) > 0
    # the order carries the rebuilt copies to the ranks, through the wire form too
    order = PlanChangeOrder.of(TARGET, NODE0, "urgent", planned, 1)
    assert order.rebuilt == ("actor-gen",) and order.dag is not None
    assert PlanChangeOrder.from_wire(order.to_wire()).rebuilt == ("actor-gen",)


def test_the_rebuild_needs_no_host_memory_for_the_whole_state() -> None:
    current = ExecutionPlan((GEN_ON_1, TRAIN_ON_BOTH))
    small = replace(SETUP, cluster=replace(SETUP.cluster, gpu=replace(
        SETUP.cluster.gpu, host_memory_bytes=1)))
    assert "host memory" in gather_reload_blocker(small, current, NODE0)
    assert plan_change(small, current, TARGET, NODE0).executor == "dag"


def test_a_rebuild_reads_from_the_nearest_source_unit_and_costs_the_far_link_more() -> None:
    both = StagePlan("actor-train", 1, 4, 2, 1, 4, replicas=(NODE0, NODE1))
    near = ExecutionPlan((TARGET.stages[0], both))  # actor-gen on node 0, a source there
    far = ExecutionPlan((TARGET.stages[0], TRAIN_ON_1))  # its only source on node 1
    lost_gen = ExecutionPlan((replace(GEN_ON_1, replicas=((4, 5),), dp=1), both))
    p_near = plan_rebuild(SETUP, lost_gen, near, (0, 1, 2, 3, 6, 7))
    p_far = plan_rebuild(SETUP, lost_gen, far, (0, 1, 2, 3, 6, 7))
    assert [u.gpus for u in p_near.rebuilt[0].feeds] == [NODE0, NODE0]
    assert [u.gpus for u in p_far.rebuilt[0].feeds] == [NODE1, NODE1]
    assert rebuild_s(SETUP, p_far.rebuilt) > rebuild_s(SETUP, p_near.rebuilt)


def test_a_lost_copy_beside_a_lost_frozen_model_stage_is_not_rebuilt() -> None:
    ref_on_1 = StagePlan("ref-inf", 1, 4, 1, 1, 8, replicas=(NODE1,))
    current = ExecutionPlan((GEN_ON_1, TRAIN_ON_BOTH, ref_on_1))
    target = ExecutionPlan((*TARGET.stages, replace(ref_on_1, replicas=(NODE0,))))
    with pytest.raises(TransitionError, match="every replica of ref-inf was lost"):
        plan_rebuild(SETUP, current, target, NODE0)
    planned = plan_change(SETUP, current, target, NODE0)  # ref-inf: only from a checkpoint
    assert planned.executor == "restart" and "ref-inf" in planned.restart_reason


def test_a_copy_lost_with_its_source_needs_the_checkpoint() -> None:
    current = ExecutionPlan((GEN_ON_1, TRAIN_ON_1))
    assert "every replica of actor-gen, actor-train was lost" in gather_reload_blocker(
        SETUP, current, NODE0)
    planned = plan_change(SETUP, current, TARGET, NODE0)
    assert planned.executor == "restart" and planned.checkpoint


def test_a_change_that_rebuilt_copies_is_no_sample_of_the_dag_rates() -> None:
    """The measured time of such a change holds the copies' weight sync, which no DAG feature
    prices: rank 0 takes no transition sample from it (it does from the same DAG alone)."""
    from pathlib import Path

    from nereus.config.load import load_config
    from nereus.config.run import parse_runtime
    from nereus.runtime.rank0.controller import RankZeroController
    from nereus.runtime.rank0.loop import RankZero

    example = Path(__file__).resolve().parents[2] / "examples" / "ppo-tiny-cpu.yaml"
    cfg = load_config(str(example))
    rc, setup = parse_runtime({**cfg.section("runtime"), "events": []}, cfg.setup, ranks=8)
    ctl = RankZeroController(setup, adapt=True)
    rz = RankZero(ctl, recorder=None, rc=rc)  # type: ignore[arg-type]
    current = ExecutionPlan((GEN_ON_1, TRAIN_ON_BOTH))
    order = PlanChangeOrder.of(TARGET, NODE0, "urgent", plan_change(SETUP, current, TARGET, NODE0),
                               1)
    assert order.rebuilt and order.dag is not None
    rz.transition_done(order, 0.5, "dag", 10**6)
    assert ctl.transition_samples == []
    rz.transition_done(replace(order, rebuilt=()), 0.5, "dag", 10**6)
    assert len(ctl.transition_samples) == 1
