"""Tier 1 (pure): model, hardware and workflow specs."""

from __future__ import annotations

import pytest

from nereus.emu.unit import Emu, Layout, emus_of_plan
from nereus.spec.model import MODEL_PRESETS
from nereus.spec.plan import Candidate, ExecutionPlan, StagePlan
from nereus.spec.workflow import Stage, build_workflow

# Published parameter counts (billions), to 0.5%.
PUBLISHED_B = {
    "llama-3.1-8b": 8.03,
    "llama-3.3-70b": 70.55,
    "qwen3-14b": 14.77,
    "qwen3-32b": 32.76,
}


@pytest.mark.parametrize("name,billions", sorted(PUBLISHED_B.items()))
def test_preset_parameter_counts(name: str, billions: float) -> None:
    got = MODEL_PRESETS[name].num_params() / 1e9
    assert abs(got - billions) / billions < 0.005


def test_ppo_sync_has_three_serial_phases() -> None:
    wf = build_workflow("ppo", "sync", reward_model=False)
    assert wf.names == ("actor-gen", "ref-inf", "critic-inf", "actor-train", "critic-train")
    assert len(wf.lanes) == 1 and len(wf.lanes[0]) == 3
    assert wf.concurrent("ref-inf", "critic-inf")
    assert not wf.concurrent("actor-gen", "actor-train")
    assert wf.shares_state("actor-gen", "actor-train")
    assert not wf.shares_state("actor-train", "critic-train")
    assert wf.by_name("critic-train").stage is Stage.TRAINING


def test_async_overlaps_generation_with_training() -> None:
    wf = build_workflow("grpo", "async", samples_per_prompt=8)
    assert wf.concurrent("actor-gen", "actor-train")
    assert not wf.concurrent("ref-inf", "actor-train")
    assert "critic-train" not in wf.names
    assert wf.by_name("actor-gen").sequences_per_prompt == 8


def test_remax_generates_a_greedy_baseline() -> None:
    wf = build_workflow("remax")
    assert wf.by_name("actor-gen").sequences_per_prompt == 2
    assert wf.by_name("actor-train").sequences_per_prompt == 1


def test_plan_round_trips_and_builds_emus() -> None:
    c = Candidate("actor-train", tp=2, pp=2, dp=2, micro_batch=1, grad_accum=4)
    sp = StagePlan.place(c, ((0, 1, 2, 3), (4, 5, 6, 7)))
    plan = ExecutionPlan((sp,))
    assert ExecutionPlan.from_dict(plan.to_dict()) == plan
    assert sp.gpu_at(dp_rank=1, pp_rank=1, tp_rank=0) == 6
    emus = emus_of_plan(plan, {"actor-train": "actor"})
    assert emus[1] == Emu("actor-train", "actor", Layout(2, 2), (4, 5, 6, 7))
    assert Layout(1, 2).divides(Layout(2, 2)) and not Layout(4, 1).divides(Layout(2, 2))
    with pytest.raises(ValueError):
        Emu("x", "x", Layout(2, 1), (0, 0))
