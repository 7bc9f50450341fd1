"""Calibration from measured stage times converges to the hidden truth of the stage."""

from __future__ import annotations

import pytest

from nereus.cost.calibration import Calibration, default_calibration
from nereus.cost.latency import stage_latency
from nereus.cost.stage_calibration import stage_time_samples, with_stage_time
from nereus.errors import ConfigError
from nereus.spec.hardware import H200, ClusterSpec, OpClass
from nereus.spec.job import JobSpec, Setup
from nereus.spec.model import LLAMA_3_1_8B
from nereus.spec.plan import Candidate

MODELS = (("actor", LLAMA_3_1_8B), ("critic", LLAMA_3_1_8B), ("reference", LLAMA_3_1_8B))
SETUP = Setup(JobSpec("ppo", "sync", MODELS, global_batch=64, prompt_len=512, gen_len=1024,
                      reward_model=False), ClusterSpec(2, 8, H200))
WF = SETUP.job.workflow


def truth() -> Calibration:
    base = default_calibration()
    # Not uniform: GEMMs 0.7×, all-reduces 0.5×, memory-bound decode 0.6×, the rest as assumed.
    factor = {OpClass.GEMM: 0.7, OpClass.ALLREDUCE_INTRA: 0.5, OpClass.DECODE_MEMORY: 0.6}
    rows = [(H200.name, op.value, base.efficiency(H200, op) * factor.get(op, 1.0)) for op in OpClass]
    return Calibration(tuple(sorted(rows)))


@pytest.mark.parametrize(
    "name,cand",
    [
        ("actor-train", Candidate("actor-train", 2, 1, 4, 1, 16)),
        ("actor-gen", Candidate("actor-gen", 4, 1, 4, 16, 1)),
        ("ref-inf", Candidate("ref-inf", 1, 2, 8, 4, 2)),
    ],
)
def test_stage_time_calibration_converges(name: str, cand: Candidate) -> None:
    ms = WF.by_name(name)
    true_s = stage_latency(SETUP, ms, cand, truth()).total_s
    calib = default_calibration()
    first_err = abs(stage_latency(SETUP, ms, cand, calib).total_s - true_s) / true_s
    for _ in range(10):
        pred = stage_latency(SETUP, ms, cand, calib)
        calib = with_stage_time(calib, pred, true_s, H200, alpha=0.5)
    err = abs(stage_latency(SETUP, ms, cand, calib).total_s - true_s) / true_s
    assert first_err > 0.2 and err < 0.05


def test_samples_cover_the_stage_classes_and_reject_bad_times() -> None:
    ms = WF.by_name("actor-train")
    cand = Candidate("actor-train", 2, 1, 4, 1, 16)
    pred = stage_latency(SETUP, ms, cand, default_calibration())
    samples = stage_time_samples(pred, pred.total_s, H200, default_calibration())
    ops = {op for op, _, _ in samples}
    assert OpClass.GEMM in ops and OpClass.ALLREDUCE_INTRA in ops
    # Measured exactly as predicted: every sample reproduces the current efficiency.
    for op, ideal_s, measured_s in samples:
        assert ideal_s / measured_s == pytest.approx(default_calibration().efficiency(H200, op))
    with pytest.raises(ConfigError):
        stage_time_samples(pred, 0.0, H200, default_calibration())
