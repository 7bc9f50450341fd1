"""The simulator runs the real controller, planner and DAG code; calibration learns the truth."""

from __future__ import annotations

import pytest

from nereus.cost.calibration import default_calibration
from nereus.errors import ConfigError
from nereus.sim.engine import SimConfig, simulate
from nereus.sim.traces import GpuTrace, LengthPoint, LengthTrace
from nereus.sim.truth import HiddenTruth, conservative_calibration, hidden_calibration
from nereus.spec.hardware import H200, ClusterSpec
from nereus.spec.job import JobSpec, Setup
from nereus.spec.model import LLAMA_3_1_8B

MODELS = (("actor", LLAMA_3_1_8B), ("critic", LLAMA_3_1_8B), ("reference", LLAMA_3_1_8B))


def small_setup() -> Setup:
    job = JobSpec("ppo", "sync", MODELS, global_batch=64, prompt_len=512, gen_len=1024,
                  gen_len_p95=1200, reward_model=False)
    return Setup(job, ClusterSpec(2, 8, H200))


FLAT = LengthTrace((LengthPoint(0, 1024.0, 1200.0),))
GROW = LengthTrace((LengthPoint(0, 1024.0, 1200.0), LengthPoint(11, 4096.0, 4500.0)))
STEADY = GpuTrace((0.0,), (16,))


def test_calibration_converges_within_ten_steps() -> None:
    setup = small_setup()
    truth = HiddenTruth(hidden_calibration(default_calibration(), H200, seed=3), noise_rel=0.0, seed=3)
    res = simulate(setup, STEADY, FLAT, SimConfig(steps=12, policy="nereus"), truth,
                   conservative_calibration(H200.name))
    errors = [abs(r.predicted_step_s - r.step_s) / r.step_s for r in res.records]
    assert errors[0] > 0.2  # the conservative start is far off
    assert max(errors[10:]) < 0.05
    # The plan the run ends on is predicted right under the learned calibration.
    rec = res.records[-1]
    assert rec.predicted_step_s == pytest.approx(rec.step_s, rel=0.05)


def test_runs_are_deterministic_and_every_policy_completes() -> None:
    setup = small_setup()
    truth = HiddenTruth(hidden_calibration(default_calibration(), H200, seed=1), 0.02, seed=1)
    trace = GpuTrace((0.0, 20.0, 400.0), (16, 8, 16))
    out = {}
    for policy in ("nereus", "static", "dynarl", "every-k", "oracle"):
        a = simulate(setup, trace, GROW, SimConfig(steps=12, policy=policy), truth, default_calibration())
        b = simulate(setup, trace, GROW, SimConfig(steps=12, policy=policy), truth, default_calibration())
        assert a.records == b.records
        assert len(a.records) == 12 and a.total_s > 0
        out[policy] = a
    # The pool halves at t = 20 s: every policy leaves the lost GPUs at once.
    for r in out.values():
        lost = [rec for rec in r.records if rec.pool_gpus == 8]
        assert lost and all(rec.max_gpu_id < 8 for rec in lost)
    assert out["oracle"].transition_s == 0.0


def test_empty_pool_waits_and_bad_config_is_rejected() -> None:
    setup = small_setup()
    truth = HiddenTruth(default_calibration(), 0.0)
    trace = GpuTrace((0.0, 600.0), (0, 16))
    res = simulate(setup, trace, FLAT, SimConfig(steps=2, policy="static"), truth, default_calibration())
    assert res.wait_s == 600.0 and res.records[0].clock_s == 600.0
    with pytest.raises(ConfigError, match="--policy"):
        SimConfig(steps=1, policy="greedy")
    with pytest.raises(ConfigError, match="--steps"):
        SimConfig(steps=0)
