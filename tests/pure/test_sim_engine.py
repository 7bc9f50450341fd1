"""The simulator runs the real controller, planner and DAG code; calibration learns the truth."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.cost.calibration import default_calibration
from nereus.errors import ConfigError
from nereus.sim.engine import SimConfig, simulate
from nereus.sim.replay import ReplayTruth, load_verl_steps
from nereus.sim.shape_truth import ShapeTruth
from nereus.sim.traces import GpuTrace, LengthPoint, LengthTrace
from nereus.sim.truth import HiddenTruth, conservative_calibration, hidden_calibration
from nereus.spec.hardware import H200, ClusterSpec
from nereus.spec.job import JobSpec, Setup
from nereus.spec.model import LLAMA_3_1_8B, QWEN2_5_0_5B
from nereus.spec.plan import ExecutionPlan, StagePlan

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


# ---- a truth of its own form (issue 20) ------------------------------------------------------

# the shared data folder beside the repository (../shared/data from a checkout in /work)
VERL_NAME = "Qwen2.5-0.5B-bsz256_2-prompt512-resp256-0.538.steps.csv"
VERL = next((p / "shared" / "data" / "verl-logs" / VERL_NAME
             for p in Path(__file__).resolve().parents
             if (p / "shared" / "data" / "verl-logs" / VERL_NAME).exists()),
            Path("shared") / "data" / "verl-logs" / VERL_NAME)


@settings(max_examples=6, deadline=None)
@given(
    nodes=st.sampled_from([1, 2, 4]),
    gen=st.sampled_from([256, 1024, 4096]),
    seed=st.integers(0, 1000),
    conservative=st.booleans(),
)
def test_calibration_converges_against_the_shape_truth(
    nodes: int, gen: int, seed: int, conservative: bool
) -> None:
    """The shape truth is not the planner's model (shape-dependent efficiencies, message-size
    dependent links, stragglers off here); calibrating from measured stage times still brings the
    prediction of the plan in force within 3% — while calibrating from op-level samples of
    reference shapes cannot, for want of the model's form."""
    job = JobSpec("ppo", "sync", MODELS, global_batch=64, prompt_len=512, gen_len=gen,
                  gen_len_p95=int(gen * 1.3), reward_model=False)
    setup = Setup(job, ClusterSpec(nodes, 8, H200))
    lengths = LengthTrace((LengthPoint(0, float(gen), gen * 1.3),))
    pool = GpuTrace((0.0,), (nodes * 8,))
    truth = ShapeTruth(noise_rel=0.0, straggler_p=0.0, seed=seed)
    start = conservative_calibration(H200.name) if conservative else default_calibration()
    res = simulate(setup, pool, lengths, SimConfig(steps=14, samples="stages"), truth, start)
    errors = [abs(r.predicted_step_s - r.step_s) / r.step_s for r in res.records]
    assert max(errors[-3:]) < 0.03
    assert errors[-1] < errors[0] or errors[0] < 0.03
    # with noise and stragglers the learned prediction stays close on average
    noisy = simulate(setup, pool, lengths, SimConfig(steps=14), ShapeTruth(seed=seed), start)
    tail = [abs(r.predicted_step_s - r.step_s) / r.step_s for r in noisy.records[-5:]]
    assert sum(tail) / len(tail) < 0.1


def test_op_samples_cannot_learn_a_truth_of_another_form() -> None:
    setup = small_setup()
    truth = ShapeTruth(noise_rel=0.0, straggler_p=0.0, seed=1)
    ops = simulate(setup, STEADY, FLAT, SimConfig(steps=10, samples="ops"), truth,
                   default_calibration())
    stages = simulate(setup, STEADY, FLAT, SimConfig(steps=10), truth, default_calibration())
    err = [abs(r.predicted_step_s - r.step_s) / r.step_s for r in (ops.records[-1],
                                                                   stages.records[-1])]
    assert err[0] > 0.1 > 0.03 > err[1]


def test_shape_truth_depends_on_shapes_the_planner_prices_flat() -> None:
    """Efficiency grows with GEMM size; small collectives are slow per byte; a decode round runs
    until its longest sequence; more replicas meet more stragglers."""
    truth = ShapeTruth(noise_rel=0.0, straggler_p=0.0)
    g = truth._rates(H200)
    small, big = g.gemm_s(512, 4096, 1024, False), g.gemm_s(16384, 4096, 1024, False)
    assert small / 512 > 1.05 * big / 16384  # per token, the small GEMM is slower
    assert g.link_s(1 << 10, False, True, 8) / (1 << 10) > 10 * g.link_s(1 << 30, False, True, 8) / (1 << 30)
    setup = small_setup()
    plan = ExecutionPlan((StagePlan("actor-gen", 1, 1, 16, 4, 1, False,
                                    tuple((i,) for i in range(16))),))
    flat = replace(setup, job=replace(setup.job, gen_len_p95=setup.job.gen_len))
    assert truth.base_stage_s(setup, plan.stages[0]) > truth.base_stage_s(flat, plan.stages[0])
    strag = ShapeTruth(noise_rel=0.0, straggler_p=0.05, straggler_slowdown=0.5, seed=2)
    slow = [strag.stage_times_s(setup, plan, s)["actor-gen"] for s in range(40)]
    base = truth.base_stage_s(setup, plan.stages[0])
    assert min(slow) == pytest.approx(base) and max(slow) > base * 1.05


@pytest.mark.skipif(not VERL.exists(), reason="shared data not present")
def test_replay_truth_replays_the_verl_log_and_scales_the_rest() -> None:
    measured, lengths = load_verl_steps(VERL)
    rows = list(csv.DictReader(VERL.read_text().splitlines()))
    by_name = {m.key[0]: m for m in measured}
    assert by_name["actor-gen"].times_s[3] == float(rows[3]["timing/gen"])
    assert by_name["critic-train"].times_s[0] == float(rows[0]["timing/update_critic"])
    assert lengths.at(2).mean == float(rows[2]["response_length/mean"])
    model = QWEN2_5_0_5B
    job = JobSpec("ppo", "sync", (("actor", model), ("critic", model), ("reference", model)),
                  global_batch=256, prompt_len=104, gen_len=235, gen_len_p95=256,
                  reward_model=False)
    setup = Setup(job, ClusterSpec(1, 2, H200))
    truth = ReplayTruth(measured, ShapeTruth(noise_rel=0.0, straggler_p=0.0))
    names = [ms.name for ms in job.workflow.model_stages]
    one = ExecutionPlan(tuple(StagePlan(n, 1, 1, 1, 1, 256, False, ((0,),)) for n in names))
    times = truth.stage_times_s(setup, one, 5)
    assert times["ref-inf"] == float(rows[5]["timing/ref"])
    assert times["actor-train"] == float(rows[5]["timing/update_actor"])
    # another layout: the shape truth scaled to the measured layout's time
    two = ExecutionPlan(tuple(StagePlan(n, 1, 1, 2, 1, 128, False, ((0,), (1,))) for n in names))
    scaled = truth.stage_times_s(setup, two, 5)
    assert 0.2 * times["actor-gen"] < scaled["actor-gen"] < times["actor-gen"]
    # the simulator runs on it, its lengths taken from the log
    res = simulate(setup, GpuTrace((0.0,), (2,)), lengths, SimConfig(steps=4), truth,
                   default_calibration())
    assert len(res.records) == 4 and all(r.step_s > 0 for r in res.records)
