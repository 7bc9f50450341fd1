"""`nereus simulate`: a real run over a shared trace, and bad input answered by one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nereus.cli import main

ROOT = Path(__file__).resolve().parents[2]
SPOT = ROOT / "data" / "traces" / "spot-traces" / "availability-16node" / "us-east-2b_v100_1.json"
FAULT = ROOT / "data" / "traces" / "fault-trace" / "fault_trace_first_half.json"
BASE = ["simulate", str(ROOT / "examples" / "ppo-llama8b-h200.yaml"), "--length-trace", "paper:25-step"]


@pytest.mark.parametrize("policy", ["nereus", "static"])
def test_simulate_json_on_a_spot_trace(policy: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main([*BASE, "--gpu-trace", str(SPOT), "--steps", "6", "--gpus-per-trace-node", "2",
               "--max-gpus", "32", "--policy", policy, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["policy"] == policy and out["steps"] == 6
    assert out["total_s"] > 0 and out["mean_step_s"] == pytest.approx(out["total_s"] / 6)
    assert set(out) == {"policy", "steps", "mean_step_s", "total_s", "transitions", "transition_s",
                        "pool_changes"}


def test_simulate_on_the_fault_trace(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main([*BASE, "--gpu-trace", str(FAULT), "--steps", "3", "--json"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["steps"] == 3


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--gpu-trace", "/nonexistent.json", "--steps", "2"], "--gpu-trace"),
        (["--gpu-trace", str(SPOT), "--steps", "0"], "--steps"),
        (["--gpu-trace", str(SPOT), "--steps", "2", "--gamma", "-1"], "--gamma"),
        (["--gpu-trace", str(SPOT), "--steps", "2", "--gpus-per-trace-node", "0"], "--gpus-per-trace-node"),
        (["--gpu-trace", str(SPOT), "--steps", "2", "--policy", "greedy"], "--policy"),
        (["--gpu-trace", str(SPOT), "--steps", "two"], "--steps"),
        (["--steps", "2"], "--gpu-trace"),
    ],
)
def test_simulate_bad_input(extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main([*BASE, *extra])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_simulate_writes_a_run_log_that_report_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "sim.h5"
    rc = main([*BASE, "--gpu-trace", str(SPOT), "--steps", "8", "--gpus-per-trace-node", "2",
               "--max-gpus", "32", "--log", str(log), "--json"])
    assert rc == 0
    capsys.readouterr()
    assert main(["report", str(log), "--json", "--no-plots"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 8 and summary["closed"]
    assert summary["replans"] >= 1 and summary["plan_timeline"]
    assert main([*BASE, "--gpu-trace", str(SPOT), "--steps", "2", "--log", str(log)]) == 2
    assert "never overwritten" in capsys.readouterr().err


def test_calibration_is_saved_and_reloaded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "calib.json"
    rc = main([*BASE, "--gpu-trace", str(SPOT), "--steps", "4", "--conservative-start",
               "--save-calibration", str(saved), "--json"])
    assert rc == 0 and saved.exists()
    doc = json.loads(saved.read_text())
    effs = doc["efficiencies"]["h200"]
    assert doc["format"] == "nereus-calibration" and 0.3 < effs["gemm"] < 1.0  # learned from 0.3
    capsys.readouterr()
    assert main(["plan", str(ROOT / "examples" / "ppo-llama8b-h200.yaml"), "--calibration", str(saved), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["feasible"]
    rc = main([*BASE, "--gpu-trace", str(SPOT), "--steps", "2", "--calibration", str(saved), "--json"])
    assert rc == 0
    capsys.readouterr()
    bad = tmp_path / "bad.json"
    for text in ("{", '{"format": "other"}', '{"format": "nereus-calibration", "version": 1, "efficiencies": {"h200": {"gemm": 2}}}'):
        bad.write_text(text)
        assert main(["plan", "--calibration", str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "calibration" in err
