"""Tier 1 (pure): the simulator on mixed pools — one GPU trace per hardware type (issue 23)."""

from __future__ import annotations

import pytest

from nereus.cost.calibration import default_calibration
from nereus.errors import ConfigError
from nereus.plan.hetero import type_errors
from nereus.sim.mixed import mixed_pool, simulate_mixed
from nereus.sim.traces import GpuTrace
from nereus.spec.hardware import H200, MI300X, ClusterSpec, NodeGroup
from nereus.spec.job import JobSpec, Setup
from nereus.spec.model import QWEN2_5_0_5B


def _setup() -> Setup:
    job = JobSpec(algorithm="grpo", mode="sync", models=(("actor", QWEN2_5_0_5B), ("reference", QWEN2_5_0_5B)),
                  global_batch=64, prompt_len=512, gen_len=1024, samples_per_prompt=4,
                  reward_model=False)
    return Setup(job, ClusterSpec.mixed((NodeGroup(2, H200), NodeGroup(2, MI300X)), 4))


# Spot H200s: none for the first 5 s, then 8 GPUs, then 4; the MI300X nodes are reserved.
SPOT = GpuTrace((0.0, 5.0, 25.0), (0, 8, 4))


def test_the_pool_follows_one_trace_per_type() -> None:
    s = _setup()
    assert mixed_pool(s, {"h200": SPOT}, 0.0) == tuple(range(8, 16))
    assert mixed_pool(s, {"h200": SPOT}, 10.0) == tuple(range(16))
    assert mixed_pool(s, {"h200": SPOT, "mi300x": GpuTrace((0.0,), (2,))}, 30.0) == (
        0, 1, 2, 3, 8, 9)


def test_policies_on_a_spot_nvidia_pool_beside_reserved_amd() -> None:
    s = _setup()
    calib = default_calibration()
    # γ = 20: a transition is admitted when it pays back within 20 expected steps
    runs = {p: simulate_mixed(s, {"h200": SPOT}, 40, p, calib, fast=H200, blind=H200, gamma=20)
            for p in ("vendor-aware", "fast-only", "vendor-blind")}
    aware, fast = runs["vendor-aware"], runs["fast-only"]
    # H200-only waits 5 s for its first node; the mixed pool starts at once on the MI300Xs.
    assert fast.wait_s == pytest.approx(5.0) and aware.wait_s == 0.0
    assert fast.records[0].t_s == pytest.approx(5.0) and fast.records[0].event == "initial"
    for r in runs.values():
        assert len(r.records) == 40 and r.total_s == pytest.approx(
            sum(x.step_s + x.transition_s for x in r.records))
    # vendor-aware takes the H200s when they come and drops what it lost when they go
    events = [(dict(x.pool_by_type)["h200"], x.event) for x in aware.records if x.event]
    assert events[0] == (0, "initial")
    assert any(n == 8 and e == "transition" for n, e in events)
    assert any(n == 4 and e in ("transition", "restart") for n, e in events)
    assert {dict(x.pool_by_type)["mi300x"] for x in aware.records} == {8}
    # with H200s up it is faster than on the MI300Xs alone, and than H200-only on the same pool
    first = aware.records[0].step_s
    assert min(x.step_s for x in aware.records) < first
    both = [x for x in aware.records if dict(x.pool_by_type)["h200"] == 8 and not x.event]
    assert both and all(x.step_s <= fast.records[1].step_s + 1e-9 for x in both)


def test_plans_of_the_vendor_aware_run_keep_units_on_one_type() -> None:
    from nereus.plan.search import search_plan

    s = _setup()
    for t in (0.0, 30.0, 70.0):
        pool = mixed_pool(s, {"h200": SPOT}, t)
        assert type_errors(s.cluster, search_plan(s, pool=pool).plan) == []


def test_a_trace_for_a_type_the_cluster_lacks_is_one_error() -> None:
    with pytest.raises(ConfigError) as e:
        simulate_mixed(_setup(), {"a100-80gb": SPOT}, 3, "vendor-aware", default_calibration())
    assert e.value.field == "gpu_traces" and "types: h200, mi300x" in e.value.rule
    with pytest.raises(ConfigError) as e:
        simulate_mixed(_setup(), {}, 3, "bogus", default_calibration())
    assert e.value.field == "policy"
