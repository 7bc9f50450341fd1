"""Fitting the cost model to measured times (pure): NNLS, parameter recovery, the prior, the
calibrated transition rates on both compilers, and calibrations read back from a run log."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.paths import REPO as ROOT

from nereus.config.load import load_config
from nereus.config.run import parse_runtime
from nereus.control.planner_port import setup_for
from nereus.control.signals import Observation
from nereus.cost.calibration import Calibration, default_calibration
from nereus.cost.fit import Sample, fit, nnls
from nereus.cost.latency import stage_latency
from nereus.cost.overhead import STEP_EVENTS, step_event_counts
from nereus.cost.stage_calibration import stage_sample
from nereus.cost.workload import stage_context
from nereus.spec.hardware import CPU_VIRTUAL, H200, ClusterSpec, OpClass
from nereus.spec.plan import Candidate


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 8), st.integers(1, 5))
def test_nnls_matches_scipy(seed: int, rows: int, cols: int) -> None:
    from scipy.optimize import nnls as scipy_nnls

    rng = np.random.default_rng(seed)
    a = rng.normal(size=(rows + cols, cols))
    b = rng.normal(size=rows + cols)
    ours = nnls(a, b)
    ref, _ = scipy_nnls(a, b)
    assert (ours >= 0).all()
    assert np.linalg.norm(a @ ours - b) == pytest.approx(np.linalg.norm(a @ ref - b), abs=1e-9)


def _tiny_setup(host_cores: int = 0):  # type: ignore[no-untyped-def]
    cfg = load_config(str(ROOT / "examples" / "ppo-tiny-cpu.yaml"))
    _, setup = parse_runtime(cfg.section("runtime"), cfg.setup, ranks=8, host_cores=host_cores)
    return setup


TRUE = Calibration().with_fit(
    CPU_VIRTUAL,
    {"gemm": 0.4, "decode-memory": 0.2, "allreduce-intra": 0.05, "p2p-intra": 0.03, "copy": 0.3},
    {"layer-pass": 2e-4, "decode-layer": 3e-4, "decode-step": 1e-4, "micro-batch": 5e-4,
     "update": 1e-2})


def _executions(n: int, seed: int):  # type: ignore[no-untyped-def]
    """``n`` (setup, model-stage, candidate) executions: every model-stage of the tiny job over
    its layouts, batch splits and generated lengths."""
    rng = np.random.default_rng(seed)
    base = _tiny_setup(host_cores=2)
    out = []
    while len(out) < n:
        mean = int(rng.integers(4, 120))
        pool = int(rng.choice([4, 8]))
        s = setup_for(base, Observation(0, mean, mean + int(rng.integers(0, 60)),
                                        tuple(range(pool))))
        ms = s.job.workflow.model_stages[int(rng.integers(len(s.job.workflow.model_stages)))]
        ctx = stage_context(s, ms)
        tp, pp = int(rng.choice([1, 2])), int(rng.choice([1, 2]))
        dp = int(rng.choice([d for d in (1, 2, 4) if ctx.per_update % d == 0]))
        per = ctx.per_update // dp
        b = int(rng.choice([x for x in (1, 2, 4, 8) if per % x == 0]))
        out.append((s, ms, Candidate(ms.name, tp, pp, dp, b, per // b)))
    return out


def _samples(runs, calib: Calibration, truth: Calibration) -> list[Sample]:  # type: ignore[no-untyped-def]
    out = []
    for s, ms, cand in runs:
        measured = stage_latency(s, ms, cand, truth).total_s
        lat = stage_latency(s, ms, cand, calib)
        counts = step_event_counts(stage_context(s, ms), cand)
        out.append(stage_sample(lat, counts, measured, s.cluster.gpu, calib,
                                contention=s.cluster.contention))
    return out


def _mape(runs, calib: Calibration, truth: Calibration) -> float:  # type: ignore[no-untyped-def]
    err = [abs(stage_latency(s, ms, c, calib).total_s - stage_latency(s, ms, c, truth).total_s)
           / stage_latency(s, ms, c, truth).total_s for s, ms, c in runs]
    return 100.0 * float(np.mean(err))


def _refit(calib: Calibration, samples: list[Sample]) -> Calibration:
    gpu = CPU_VIRTUAL
    inv = {op.value: 1.0 / calib.efficiency(gpu, op) for op in OpClass}
    fixed = {k: calib.fixed_s(gpu, k) for k in STEP_EVENTS}
    x_inv, x_fixed = fit(samples, inv, fixed)
    return calib.with_fit(gpu, {k: 1.0 / v for k, v in x_inv.items()}, x_fixed)


def test_fitting_measured_stage_times_predicts_unseen_executions() -> None:
    """Times made by the model under hidden parameters (no noise): a few refits on 40
    executions recover predictions of 40 others — the model's form is fitted, not memorized."""
    train, held_out = _executions(40, 1), _executions(40, 2)
    calib = default_calibration()
    before = _mape(held_out, calib, TRUE)
    for _ in range(6):
        calib = _refit(calib, _samples(train, calib, TRUE))
    after = _mape(held_out, calib, TRUE)
    assert before > 30.0 and after < 5.0, (before, after)


def test_the_prior_keeps_what_no_sample_exercises() -> None:
    gpu = CPU_VIRTUAL
    only_gemm = [Sample((("gemm", 1.0),), (), 4.0)]
    x_inv, x_fixed = fit(only_gemm, {"gemm": 2.0, "copy": 3.0}, {"update": 0.5})
    assert set(x_inv) == {"gemm"} and not x_fixed  # nothing else is returned, so kept
    assert 2.0 < x_inv["gemm"] < 4.0  # moved towards the sample, held by the prior
    calib = Calibration().with_fit(gpu, {"gemm": 1 / x_inv["gemm"]}, {})
    assert calib.efficiency(gpu, OpClass.COPY) == default_calibration().efficiency(gpu,
                                                                                  OpClass.COPY)


def test_calibration_round_trips_with_fixed_costs(tmp_path: Path) -> None:
    from nereus.log.calibration_store import load_calibration, save_calibration

    assert TRUE.fixed_s(CPU_VIRTUAL, "update") == 1e-2
    assert TRUE.fixed_s(H200, "comm-setup") == H200.comm_setup_s  # the preset's default
    assert Calibration.from_dict(TRUE.to_dict()) == TRUE
    path = tmp_path / "c.json"
    save_calibration(path, TRUE)
    assert load_calibration(path) == TRUE
    from nereus.errors import ConfigError

    with pytest.raises(ConfigError, match=r"fixed_costs\.cpu\.update"):
        Calibration.from_dict({"fixed_costs": {"cpu": {"update": -1}}})


def test_calibration_files_are_written_as_version_2_and_versions_1_and_2_read(
        tmp_path: Path) -> None:
    """The versions the code writes are the versions it reads: 2 (written now: fixed costs
    always present) and 1 (fixed costs only when any was learned); any other is refused."""
    import json

    from nereus.errors import ConfigError
    from nereus.log.calibration_store import load_calibration, save_calibration

    path = tmp_path / "c.json"
    save_calibration(path, Calibration())
    doc = json.loads(path.read_text())
    assert doc["version"] == 2 and doc["fixed_costs"] == {}
    assert load_calibration(path) == Calibration()
    body = {k: v for k, v in TRUE.to_dict().items() if k != "fixed_costs"}
    for version, extra in ((1, {}), (1, {"fixed_costs": TRUE.to_dict()["fixed_costs"]}),
                           (2, {"fixed_costs": TRUE.to_dict()["fixed_costs"]})):
        old = tmp_path / f"v{version}-{len(extra)}.json"
        old.write_text(json.dumps({"format": "nereus-calibration", "version": version, **body,
                                   **extra}))
        got = load_calibration(old)
        assert got.efficiencies == TRUE.efficiencies
        assert bool(got.fixed_costs) == bool(extra)
    for bad in (0, 3, "2", True, None):
        other = tmp_path / "bad.json"
        other.write_text(json.dumps({"format": "nereus-calibration", "version": bad, **body}))
        with pytest.raises(ConfigError, match="this nereus reads versions 1 and 2"):
            load_calibration(other)


def test_calibrated_transition_rates_are_the_same_on_both_compilers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from support.transition_cases import case

    from nereus.transition.batched import plan as batched

    monkeypatch.setattr(batched, "SMALL_UNITS", 0)  # small cases too on the batched path
    from nereus.cost.calibration import Calibration
    from nereus.transition.cost import transition_cost_s
    from nereus.transition.planned import plan_plans
    from nereus.transition.reference.compile import compile_plans

    cluster = ClusterSpec(8, 2, H200)
    calib = Calibration().with_fit(H200, {"p2p-intra": 0.5, "p2p-inter": 0.25},
                                   {"comm-setup": 0.02, "unit-build": 0.3, "transition": 1.5})
    batched_seen = 0
    for seed in range(12):
        cur, tgt, states, sizer, pool = case(seed)
        try:
            ref = compile_plans(cur, tgt, states, sizer, spare_gpus=pool)
        except Exception:
            continue
        got = plan_plans(cur, tgt, states, sizer, cluster, spare_gpus=pool, calib=calib)
        batched_seen += got.batched is not None
        assert got.cost_s == pytest.approx(transition_cost_s(ref, cluster, calib), rel=1e-12)
        builds = sum(type(p).__name__ != "Destroy" for p in ref.primitives)
        # at least the fixed cost and every build: they do not overlap
        assert got.cost_s >= 1.5 + 0.3 * builds
    assert batched_seen > 0


def test_a_run_log_gives_back_its_last_calibration(tmp_path: Path) -> None:
    from nereus.log.calibration_store import load_calibration
    from nereus.log.writer import RunLogWriter

    path = tmp_path / "run.h5"
    w = RunLogWriter(str(path), {"command": "test"}, {})
    w.log_efficiency(0, "cpu", "gemm", 0.5)
    w.log_fixed_cost(0, "cpu", "update", 0.25)
    w.log_efficiency(1, "cpu", "gemm", 0.4)  # the last row wins
    w.log_stage_time(1, "actor-train", 1.0, 1.25)
    w.close()
    calib = load_calibration(path)
    assert calib.efficiency(CPU_VIRTUAL, OpClass.GEMM) == 0.4
    assert calib.fixed_s(CPU_VIRTUAL, "update") == 0.25


def test_a_log_of_schema_1_reads_with_the_new_tables_empty(tmp_path: Path) -> None:
    import h5py

    from nereus.log import schema as S
    from nereus.log.reader import read_run_log
    from nereus.log.writer import RunLogWriter

    path = tmp_path / "old.h5"
    w = RunLogWriter(str(path), {"command": "test"}, {})
    w.log_step(0, step_s=1.0, gen_len_mean=2.0, gen_len_p95=3.0, pool_gpus=2, stage_s={},
               peak_memory_bytes={}, reward=0.0, tokens=1)
    w.close()
    with h5py.File(path, "r+") as f:  # what version 1 wrote
        f.attrs[S.ATTR_VERSION] = np.int64(1)
        for t in S.TABLES:
            if t.since > 1:
                del f[t.name]
    log = read_run_log(path)
    assert log.schema_version == 1 and log.rows("steps") == 1
    assert log.tables["stage_times"]["step"].size == 0


def test_cpu_ranks_sharing_a_host_run_slower_in_the_model() -> None:
    one = _tiny_setup()
    shared = _tiny_setup(host_cores=2)
    assert one.cluster.contention == 1.0 and shared.cluster.contention == 4.0
    s4 = setup_for(shared, Observation(0, 8, 9, tuple(range(4))))  # half the ranks run
    assert s4.cluster.contention == 2.0
    ms = one.job.workflow.by_name("actor-train")
    cand = Candidate(ms.name, 1, 1, 2, 1, 4)
    a = stage_latency(setup_for(one, Observation(0, 8, 9, tuple(range(8)))), ms, cand,
                      default_calibration()).total_s
    b = stage_latency(setup_for(shared, Observation(0, 8, 9, tuple(range(8)))), ms, cand,
                      default_calibration()).total_s
    assert b == pytest.approx(4.0 * a)
    assert dataclasses.replace(H200).name == "h200"


def test_a_change_without_a_dag_is_costed_by_the_features_its_sample_is_fitted_on() -> None:
    from nereus.transition.cost import restart_cost_s, restart_features

    cluster = ClusterSpec(8, 2, H200)
    nbytes, units = 3_000_000_000, 9
    # uncalibrated: the state twice over the inter-node link, a communicator set-up per unit
    assert restart_cost_s(cluster, nbytes, units) == pytest.approx(
        2 * nbytes / (H200.inter_node_gbps * 1e9) + units * H200.comm_setup_s)
    calib = Calibration().with_fit(H200, {"p2p-inter": 0.4},
                                   {"reload-unit": 0.03, "transition": 0.05, "unit-build": 9.0})
    ideal, counts = restart_features(cluster, nbytes, units)
    assert "unit-build" not in counts  # a DAG primitive's build is another event
    sample = Sample(tuple(ideal.items()), tuple(counts.items()), 1.0)
    assert restart_cost_s(cluster, nbytes, units, calib) == pytest.approx(sample.predict_s(
        {"p2p-inter": 1 / 0.4}, {"reload-unit": 0.03, "transition": 0.05}), rel=1e-12)
    # measured changes of several sizes give back the per-unit and per-change seconds
    truth = Calibration().with_fit(H200, {"p2p-inter": 0.5},
                                   {"reload-unit": 0.02, "transition": 0.08})
    samples = []
    for n, gb in ((3, 8), (5, 1), (9, 4), (12, 2), (16, 6)):
        i, c = restart_features(cluster, gb * 10**9, n)
        samples.append(Sample(tuple(i.items()), tuple(c.items()),
                              restart_cost_s(cluster, gb * 10**9, n, truth)))
    inv, fixed = fit(samples, {"p2p-inter": 2.0}, {"reload-unit": 0.05, "transition": 0.05},
                     prior_weight=1e-6)
    assert inv["p2p-inter"] == pytest.approx(2.0, rel=1e-3)
    assert fixed["reload-unit"] == pytest.approx(0.02, rel=1e-2)
    assert fixed["transition"] == pytest.approx(0.08, rel=1e-2)
