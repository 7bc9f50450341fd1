"""A frozen copy of a trained model-stage (actor-gen of actor-train, critic-inf of
critic-train) whose every replica is lost comes back from a replica of its source, as the
runtime's recovery does: the planner prices gather-and-reload for it, not checkpoint/restart;
a trained model-stage, or a copy whose source is lost too, still needs the checkpoint."""

from __future__ import annotations

from support.staged_cases import SETUP

from nereus.spec.plan import ExecutionPlan, StagePlan
from nereus.spec.workflow import build_workflow
from nereus.transition.change import plan_change
from nereus.transition.fallbacks import gather_reload_blocker

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


def test_a_lost_copy_whose_source_survives_is_gathered_and_reloaded() -> None:
    current = ExecutionPlan((GEN_ON_1, TRAIN_ON_BOTH))
    assert gather_reload_blocker(SETUP, current, NODE0) == ""
    planned = plan_change(SETUP, current, TARGET, NODE0)
    assert planned.executor == "gather-reload"
    assert "every replica of actor-gen was lost" in planned.restart_reason


def test_a_copy_lost_with_its_source_needs_the_checkpoint() -> None:
    current = ExecutionPlan((GEN_ON_1, TRAIN_ON_1))
    assert "every replica of actor-gen, actor-train was lost" in gather_reload_blocker(
        SETUP, current, NODE0)
    planned = plan_change(SETUP, current, TARGET, NODE0)
    assert planned.executor == "restart" and planned.checkpoint
