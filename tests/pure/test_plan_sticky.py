"""Sticky placement (issue 37): a replan after a node loss keeps every surviving replica of a
model-stage whose tp and pp stay on its GPUs, so the transition moves only what it must."""

from __future__ import annotations

from support.plan_cases import CALIB, llama_setup

from nereus.plan.assign import placement_errors
from nereus.plan.candidates import CostCache
from nereus.plan.search import search_plan


def test_replan_after_a_node_loss_keeps_the_surviving_replicas() -> None:
    setup = llama_setup(16, gen_len=2048, global_batch=512)
    cache = CostCache()
    before = search_plan(setup, CALIB, cache=cache).plan
    lost = {g for g in range(5 * 8, 6 * 8)}  # node 5
    pool = tuple(g for g in setup.cluster.all_gpus() if g not in lost)
    layouts = {sp.name: (sp.tp, sp.pp) for sp in before.stages}
    kept = search_plan(setup, CALIB, pool=pool, cache=cache, layouts=layouts, keep=before).plan
    fresh = search_plan(setup, CALIB, pool=pool, cache=cache, layouts=layouts).plan
    assert not placement_errors(setup, kept, pool)
    moved_kept = moved_fresh = 0
    for old, new, other in zip(before.stages, kept.stages, fresh.stages, strict=True):
        survivors = [r for r in old.replicas if not set(r) & lost]
        stay = min(len(survivors), new.dp)
        # as many survivors as the new dp holds stay where they are
        assert len(set(survivors) & set(new.replicas)) == stay, old.name
        moved_kept += sum(r not in set(new.replicas) for r in survivors)
        moved_fresh += sum(r not in set(other.replicas) for r in survivors)
    # without it the assignment packs the pool afresh: replicas after the hole move
    assert moved_fresh > moved_kept
