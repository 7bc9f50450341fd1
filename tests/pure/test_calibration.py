"""Calibration store: H200 defaults from the measurements, EMA, serialization, validation."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.cost.calibration import Calibration, default_calibration
from nereus.cost.defaults import CPU_EFFICIENCY
from nereus.cost.h200_defaults import H200_EFFICIENCY, H200_HBM_GBPS, H200_PEAK_TFLOPS
from nereus.errors import ConfigError
from nereus.spec.hardware import (
    A100_64GB,
    CONSERVATIVE_EFFICIENCY,
    CPU_VIRTUAL,
    H200,
    GpuSpec,
    OpClass,
)

DATA = Path(__file__).resolve().parents[2] / "nereus" / "spec" / "data" / "h200_op_efficiency.json"
OPS = list(OpClass)


def test_h200_defaults_recomputed_from_measurements() -> None:
    d = json.loads(DATA.read_text())
    assert len(d["gemm"]) == 60
    assert H200.peak_flops == H200_PEAK_TFLOPS * 1e12
    assert H200.hbm_gbps == H200_HBM_GBPS
    gemm = [x for r in d["gemm"] for x in (r["fwd_tflops"], r["bwd_tflops"])]
    attn = [x for r in d["attention"] for x in (r["fwd_tflops"], r["fwd_bwd_tflops"])]
    expected = {
        "gemm": statistics.median(gemm) / H200_PEAK_TFLOPS,
        "attention": statistics.median(attn) / H200_PEAK_TFLOPS,
        "decode-memory": statistics.median(r["weight_GBps"] for r in d["decode_gemv"]) / H200_HBM_GBPS,
        "copy": d["bandwidth"]["d2d_copy_GBps"] / H200_HBM_GBPS,
    }
    assert set(H200_EFFICIENCY) == set(expected)
    for op, value in expected.items():
        assert H200_EFFICIENCY[op] == pytest.approx(value, abs=5e-5), op
        assert default_calibration().efficiency(H200, OpClass(op)) == H200_EFFICIENCY[op]


@pytest.mark.parametrize("op", OPS)
def test_unseen_classes_are_conservative(op: OpClass) -> None:
    c = default_calibration()
    assert c.efficiency(A100_64GB, op) == CONSERVATIVE_EFFICIENCY
    custom = GpuSpec("my-gpu", "nvidia", 10**10, 1e14, 1000.0, 100.0, 10.0)
    assert c.efficiency(custom, op) == CONSERVATIVE_EFFICIENCY
    if op.value not in H200_EFFICIENCY:
        assert c.efficiency(H200, op) == CONSERVATIVE_EFFICIENCY
    if op.value not in CPU_EFFICIENCY:
        assert c.efficiency(CPU_VIRTUAL, op) == CONSERVATIVE_EFFICIENCY
    else:
        assert c.efficiency(CPU_VIRTUAL, op) == CPU_EFFICIENCY[op.value]


def test_one_ema_step_is_exact() -> None:
    c = default_calibration()
    old = c.efficiency(H200, OpClass.GEMM)
    c2 = c.with_time_sample(H200, OpClass.GEMM, ideal_s=1.0, measured_s=2.5, alpha=0.25)
    assert c2.efficiency(H200, OpClass.GEMM) == pytest.approx(0.75 * old + 0.25 * 0.4)
    # other hardware and other classes untouched
    assert c2.efficiency(A100_64GB, OpClass.GEMM) == CONSERVATIVE_EFFICIENCY
    assert c2.efficiency(H200, OpClass.ATTENTION) == c.efficiency(H200, OpClass.ATTENTION)
    assert c == default_calibration()  # frozen value: the original is unchanged


@settings(max_examples=60, deadline=None)
@given(
    true_eff=st.floats(0.01, 1.0),
    alpha=st.floats(0.1, 1.0),
    gpu=st.sampled_from([H200, A100_64GB, CPU_VIRTUAL]),
    op=st.sampled_from(OPS),
    ideal_s=st.floats(1e-6, 10.0),
)
def test_ema_converges_to_true_efficiency(
    true_eff: float, alpha: float, gpu: GpuSpec, op: OpClass, ideal_s: float
) -> None:
    c = default_calibration()
    start_err = abs(c.efficiency(gpu, op) - true_eff)
    for _ in range(200):
        c = c.with_time_sample(gpu, op, ideal_s, ideal_s / true_eff, alpha)
    assert c.efficiency(gpu, op) == pytest.approx(true_eff, rel=1e-6, abs=1e-9)
    assert abs(c.efficiency(gpu, op) - true_eff) <= start_err + 1e-12


def test_sample_faster_than_peak_is_clamped() -> None:
    c = default_calibration().with_time_sample(A100_64GB, OpClass.COPY, 2.0, 1.0, 1.0)
    assert c.efficiency(A100_64GB, OpClass.COPY) == 1.0


def test_memory_factor() -> None:
    c = default_calibration()
    assert c.memory_factor("actor-train") == 1.0
    c = c.with_memory_sample("actor-train", predicted_bytes=100.0, measured_bytes=120.0, alpha=0.5)
    assert c.memory_factor("actor-train") == pytest.approx(1.1)
    assert c.memory_factor("critic-train") == 1.0
    for _ in range(100):
        c = c.with_memory_sample("actor-train", 100.0, 120.0, 0.5)
    assert c.memory_factor("actor-train") == pytest.approx(1.2)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"ideal_s": 0.0, "measured_s": 1.0, "alpha": 0.5}, "ideal_s"),
        ({"ideal_s": 1.0, "measured_s": -1.0, "alpha": 0.5}, "measured_s"),
        ({"ideal_s": 1.0, "measured_s": float("nan"), "alpha": 0.5}, "measured_s"),
        ({"ideal_s": 1.0, "measured_s": 1.0, "alpha": 0.0}, "alpha"),
        ({"ideal_s": 1.0, "measured_s": 1.0, "alpha": 1.5}, "alpha"),
    ],
)
def test_bad_samples_rejected(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        default_calibration().with_time_sample(H200, OpClass.GEMM, **kwargs)
    assert err.value.field == field
    with pytest.raises(ConfigError):
        default_calibration().with_memory_sample("x", 0.0, 1.0, 0.5)


samples = st.lists(
    st.tuples(
        st.sampled_from([H200, A100_64GB, CPU_VIRTUAL]),
        st.sampled_from(OPS),
        st.floats(1e-3, 1.0),
        st.floats(1e-3, 10.0),
        st.floats(0.05, 1.0),
    ),
    max_size=12,
)
mem_samples = st.lists(
    st.tuples(
        st.sampled_from(["actor-gen", "actor-train", "critic-train"]),
        st.floats(1e6, 1e11),
        st.floats(1e6, 1e11),
        st.floats(0.05, 1.0),
    ),
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(samples, mem_samples)
def test_round_trip(ts: list, ms: list) -> None:
    c = default_calibration()
    for gpu, op, ideal, measured, alpha in ts:
        c = c.with_time_sample(gpu, op, ideal, measured, alpha)
    for name, pred, meas, alpha in ms:
        c = c.with_memory_sample(name, pred, meas, alpha)
    text = json.dumps(c.to_dict(), sort_keys=True)
    back = Calibration.from_dict(json.loads(text))
    assert back == c
    for gpu, op, *_ in ts:
        assert back.efficiency(gpu, op) == c.efficiency(gpu, op)


def test_updates_on_different_keys_commute() -> None:
    a = default_calibration().with_time_sample(H200, OpClass.GEMM, 1, 2, 0.5)
    a = a.with_time_sample(A100_64GB, OpClass.P2P_INTER, 1, 3, 0.5)
    b = default_calibration().with_time_sample(A100_64GB, OpClass.P2P_INTER, 1, 3, 0.5)
    b = b.with_time_sample(H200, OpClass.GEMM, 1, 2, 0.5)
    assert a == b
    assert json.dumps(a.to_dict()) == json.dumps(b.to_dict())


@pytest.mark.parametrize(
    ("bad", "field_part"),
    [
        ([], "calibration"),
        ("gemm: 0.5", "calibration"),
        ({"efficiency": {}}, "calibration.efficiency"),
        ({"efficiencies": []}, "calibration.efficiencies"),
        ({"efficiencies": {"h200": 0.5}}, "calibration.efficiencies.h200"),
        ({"efficiencies": {"h200": {"matmul": 0.5}}}, "calibration.efficiencies.h200.matmul"),
        ({"efficiencies": {"h200": {"gemm": 1.5}}}, "calibration.efficiencies.h200.gemm"),
        ({"efficiencies": {"h200": {"gemm": 0}}}, "calibration.efficiencies.h200.gemm"),
        ({"efficiencies": {"h200": {"gemm": "fast"}}}, "calibration.efficiencies.h200.gemm"),
        ({"efficiencies": {"h200": {"gemm": True}}}, "calibration.efficiencies.h200.gemm"),
        ({"efficiencies": {"": {"gemm": 0.5}}}, "calibration.efficiencies."),
        ({"memory_factors": [1.0]}, "calibration.memory_factors"),
        ({"memory_factors": {"actor-train": -2}}, "calibration.memory_factors.actor-train"),
        ({"memory_factors": {"actor-train": float("inf")}}, "calibration.memory_factors.actor-train"),
    ],
)
def test_bad_dict_is_config_error(bad: object, field_part: str) -> None:
    with pytest.raises(ConfigError) as err:
        Calibration.from_dict(bad)
    assert err.value.field.startswith(field_part)
    assert "\n" not in str(err.value)


def test_published_presets_recomputed_from_their_sources() -> None:
    """data/SOURCES.md, "GPU presets": MAMF fractions × the H200's layer/best-shape ratio; the
    attention share of the H200; all-reduce bus bandwidth over the link, capped at 0.95."""
    from nereus.cost.published_defaults import PUBLISHED_EFFICIENCY
    from nereus.spec.hardware import A100_80GB, H100_80GB, MI250X_GCD, MI300X

    factor = H200_EFFICIENCY["gemm"] / (794.5 / 989.0)
    mamf = {"a100-80gb": 271.2 / 312, "h100-80gb": 794.5 / 989, "mi300x": 668.4 / 1300}
    bus = {"a100-80gb": 240 / 300, "h100-80gb": 0.95, "mi300x": 48 / 64}
    c = default_calibration()
    for gpu in (A100_80GB, H100_80GB, MI300X):
        eff = PUBLISHED_EFFICIENCY[gpu.name]
        assert eff["gemm"] == pytest.approx(mamf[gpu.name] * factor, abs=2e-3)
        assert eff["attention"] == pytest.approx(
            eff["gemm"] * H200_EFFICIENCY["attention"] / H200_EFFICIENCY["gemm"], abs=1e-4)
        assert eff["allreduce-intra"] == pytest.approx(bus[gpu.name], abs=1e-4)
        for op in OPS:  # classes without a public measurement start conservative
            want = eff.get(op.value, CONSERVATIVE_EFFICIENCY)
            assert c.efficiency(gpu, op) == want
    # the H100 and the H200 share the silicon: the same GEMM default
    assert PUBLISHED_EFFICIENCY["h100-80gb"]["gemm"] == H200_EFFICIENCY["gemm"]
    assert all(c.efficiency(MI250X_GCD, op) == CONSERVATIVE_EFFICIENCY for op in OPS)
