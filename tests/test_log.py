"""HDF5 run log: round trip, SWMR reader during writes, kill -9 of a writer, bad files, report."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from log_writer_proc import STAGES, expected_peak_bytes, expected_step_s

from nereus.cli import main as cli_main
from nereus.errors import ConfigError, LogFormatError
from nereus.log import schema as S
from nereus.log.reader import read_run_log, swmr_fapl
from nereus.log.writer import RunLogWriter
from nereus.spec.plan import ExecutionPlan, StagePlan

REPO = Path(__file__).resolve().parents[1]
WRITER = Path(__file__).with_name("log_writer_proc.py")
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _plan(tp: int, dp: int) -> ExecutionPlan:
    reps = tuple(tuple(r * tp + t for t in range(tp)) for r in range(dp))
    return ExecutionPlan((StagePlan("actor-gen", tp, 1, dp, 2, 1, False, reps),))


def _write_full(path: Path, steps: int = 6, gpus: int = 3) -> None:
    """One of every record type; values chosen so that each column is checkable."""
    with RunLogWriter(
        path, {"job": "rt", "n": 1}, {"model": "tiny-gpt", "lr": 1e-5}, initial_plan=_plan(2, 1)
    ) as w:
        for s in range(steps):
            w.log_calibration_sample(s, "h200", "gemm", 0.5 * s, 0.7 * s)
            w.log_efficiency(s, "h200", "attention", 0.25 + 0.01 * s)
            w.log_step(
                s,
                step_s=2.0 + s,
                gen_len_mean=10.0 * s,
                gen_len_p95=np.float64(20.0 * s),
                pool_gpus=gpus,
                stage_s={"actor-gen": 1.0 + s},
                reward=math.nan,
                peak_memory_bytes=[10 * s + g for g in range(gpus)],
                tokens=np.int64(7 * s),
            )
            if s == 2:
                w.log_replan(s, "gpu-pool-change", [_plan(1, 2)], {"0": 1.5}, {"0": 3e9})
                w.log_admission(s, True, "urgent", {"why": "lost GPU", "gpu": 3}, 0.5, 0.2, 1.0)
                w.log_admission(s, False, "opportunistic", "ratio 0.7 > 0.5", 0.1, 0.3, 2.0)
                w.log_transition(
                    s,
                    {"nodes": [1, 2], "edges": [[1, 2]]},
                    ["split", "merge"],
                    123_456_789,
                    0.25,
                    0.5,
                    _plan(1, 2),
                )
                w.log_event(s, "node-failure", {"node": "n3"}, time_s=1234.5)


def test_round_trip_of_every_record_type(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    _write_full(path)
    log = read_run_log(path)
    assert log.schema_version == S.SCHEMA_VERSION and log.closed
    assert log.run_meta == {"job": "rt", "n": 1}
    assert log.config == {"model": "tiny-gpt", "lr": 1e-5}
    assert ExecutionPlan.from_dict(log.initial_plan) == _plan(2, 1)
    st = log.steps
    assert st["step"].tolist() == list(range(6))
    assert st["step_s"].tolist() == [2.0 + s for s in range(6)]
    assert st["gen_len_p95"].tolist() == [20.0 * s for s in range(6)]
    assert st["tokens"].tolist() == [7 * s for s in range(6)]
    assert np.isnan(st["reward"]).all() and (st["pool_gpus"] == 3).all()
    assert st["stage_s"][4] == {"actor-gen": 5.0}
    # the transition after step 2 puts plan 1 in force from step 3
    assert st["plan_version"].tolist() == [0, 0, 0, 1, 1, 1]
    mem = log.tables["gpu_memory"]
    assert mem["peak_bytes"].tolist() == [10 * s + g for s in range(6) for g in range(3)]
    assert mem["global_gpu"].tolist() == [0, 1, 2] * 6
    cal = log.tables["calibration_samples"]
    assert cal["hardware"].tolist() == ["h200"] * 6 and cal["op_class"][0] == "gemm"
    assert cal["measured_s"].tolist() == [0.7 * s for s in range(6)]
    assert log.tables["efficiencies"]["efficiency"][5] == pytest.approx(0.30)
    rp = log.tables["replans"]
    assert rp["trigger"].tolist() == ["gpu-pool-change"]
    assert ExecutionPlan.from_dict(rp["candidates"][0][0]) == _plan(1, 2)
    assert rp["predicted_s"][0] == {"0": 1.5} and rp["predicted_memory_bytes"][0] == {"0": 3e9}
    ad = log.tables["admissions"]
    assert ad["admitted"].tolist() == [True, False] and ad["admitted"].dtype == np.bool_
    assert ad["path"].tolist() == ["urgent", "opportunistic"]
    assert ad["reason"].tolist() == [{"why": "lost GPU", "gpu": 3}, "ratio 0.7 > 0.5"]
    assert ad["horizon_steps"].tolist() == [1.0, 2.0]
    tr = log.tables["transitions"]
    assert tr["transfer_bytes"].tolist() == [123_456_789]
    assert tr["dag"][0] == {"nodes": [1, 2], "edges": [[1, 2]]}
    assert tr["primitives"][0] == ["split", "merge"]
    assert ExecutionPlan.from_dict(tr["plan"][0]) == _plan(1, 2)
    ev = log.events
    assert ev["kind"].tolist() == ["run-start", "node-failure", "run-end"]
    assert ev["time_s"][1] == 1234.5 and ev["detail"][1] == {"node": "n3"}
    assert ev["detail"][2] == {"clean": True} and ev["step"][2] == 5
    assert all(v == 0 for v in log.dropped_rows.values())


def test_file_is_hdf5_110_swmr_layout(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    _write_full(path)
    with h5py.File(path, "r") as f:
        assert f.attrs[S.ATTR_FORMAT] == S.FORMAT_NAME.encode()
        for t in S.TABLES:
            ds = f[t.name]
            assert ds.maxshape == (None,) and ds.chunks is not None
            assert not any(h5py.check_vlen_dtype(ds.dtype[n]) for n in ds.dtype.names)
    with open(path, "rb") as fh:
        assert fh.read(9)[8] == 3  # superblock version 3: the v110 format that SWMR needs


def test_writer_refuses_to_overwrite_and_bad_names(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    path.write_bytes(b"keep me")
    with pytest.raises(ConfigError) as err:
        RunLogWriter(path, {}, {})
    assert "\n" not in str(err.value) and path.read_bytes() == b"keep me"
    with RunLogWriter(path, {}, {}, overwrite=True) as w:
        with pytest.raises(ConfigError):
            w.log_event(0, "x" * (S.NAME_BYTES + 1))
        with pytest.raises(ConfigError):
            w.log_admission(0, True, "sideways", "", 0.0, 0.0, 0.0)
    assert read_run_log(path).rows("events") == 2  # run-start and run-end only


def test_exception_in_context_marks_run_end_unclean(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    with pytest.raises(RuntimeError), RunLogWriter(path, {}, {}) as w:
        w.log_step(0, step_s=1.0)
        raise RuntimeError("boom")
    detail = read_run_log(path).events["detail"][-1]
    assert detail == {"clean": False, "error": "RuntimeError: boom"}


def test_reader_drops_unflushed_tail_rows_and_rejects_damage_before_it(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    _write_full(path)
    with h5py.File(path, "r+") as f:  # an extent that reached the file, rows that did not
        f["steps"].resize((8,))
        ev = f["events"]
        n = ev.shape[0]
        ev.resize((n + 1,))
        row = ev[n - 1]
        row["detail_off"] = f[S.HEAP].shape[0] + 10  # JSON bytes past the heap: not flushed
        ev[n] = row
    log = read_run_log(path)
    assert log.rows("steps") == 6 and log.dropped_rows["steps"] == 2
    assert log.dropped_rows["events"] == 1 and log.events["kind"][-1] == "run-end"
    with h5py.File(path, "r+") as f:
        row = f["steps"][2]
        row[S.COMMITTED] = 0
        f["steps"][2] = row
    with pytest.raises(LogFormatError, match="damaged row 2"):
        read_run_log(path)


def test_concurrent_reader_sees_rows_grow(tmp_path: Path) -> None:
    path = tmp_path / "live.h5"
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(path), "--steps", "24", "--sleep", "0.03"],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        seen = []
        for line in proc.stdout:
            step = int(line)
            if step % 4 == 1:
                log = read_run_log(path)  # while the writer holds the file open
                assert not log.closed
                assert log.rows("steps") >= step + 1  # every flushed step is visible
                assert log.steps["step_s"][: step + 1].tolist() == [
                    expected_step_s(s) for s in range(step + 1)
                ]
                seen.append(log.rows("steps"))
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        proc.wait()
    assert len(seen) == 6 and seen == sorted(seen) and seen[-1] > seen[0]
    final = read_run_log(path)
    assert final.closed and final.rows("steps") == 24


def _check_killed_log(path: Path, last_reported: int, gpus: int) -> int:
    log = read_run_log(path)
    n = log.rows("steps")
    assert n >= last_reported + 1, (n, last_reported)
    assert log.steps["step"].tolist() == list(range(n))
    assert log.steps["step_s"].tolist() == [expected_step_s(s) for s in range(n)]
    assert log.steps["stage_s"][n - 1] == {k: expected_step_s(n - 1) / len(STAGES) for k in STAGES}
    mem = log.tables["gpu_memory"]
    assert mem["step"].size >= n * gpus
    assert mem["peak_bytes"][: n * gpus].tolist() == [
        expected_peak_bytes(s, g) for s in range(n) for g in range(gpus)
    ]
    assert log.rows("calibration_samples") >= n
    assert not log.closed
    return n


def test_kill_9_writer_20_trials(tmp_path: Path) -> None:
    """20 writers killed at seeded random moments: every reported (flushed) step reads back."""
    rng = random.Random(20261201)
    gpus = 4
    trials = [(i, rng.randint(0, 40), rng.random() * 0.004) for i in range(20)]
    # Writers start a batch at a time (interpreter start-up overlaps); each waits for "go", so
    # that it writes only while its own kill is being timed.
    batch = 5
    checked = []
    for b in range(0, len(trials), batch):
        procs = []
        for i, _, _ in trials[b : b + batch]:
            path = tmp_path / f"kill{i}.h5"
            proc = subprocess.Popen(
                [sys.executable, str(WRITER), str(path), "--gpus", str(gpus), "--wait-go"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=ENV,
            )
            procs.append((proc, path))
        for (proc, path), (i, wait_steps, delay_s) in zip(
            procs, trials[b : b + batch], strict=True
        ):
            assert proc.stdout is not None and proc.stdin is not None
            try:
                assert proc.stdout.readline().strip() == "ready"
                proc.stdin.write("go\n")
                proc.stdin.flush()
                for _ in range(wait_steps):
                    proc.stdout.readline()
                time.sleep(delay_s)
                os.kill(proc.pid, signal.SIGKILL)
                rest = proc.stdout.read().split()
            finally:
                proc.kill()
                proc.wait()
            assert proc.returncode == -signal.SIGKILL
            reported = [int(x) for x in rest if x.isdigit()]
            last = reported[-1] if reported else wait_steps - 1
            n = _check_killed_log(path, last, gpus)
            out = tmp_path / f"report{i}"
            assert cli_main(["report", str(path), "--out", str(out)]) == 0
            assert all(
                (out / name).read_bytes()[:8] == PNG_MAGIC
                for name in (
                    "step_latency.png",
                    "plan_timeline.png",
                    "gpu_memory.png",
                    "transitions.png",
                )
            )
            checked.append((last, n))
    assert len(checked) == 20
    # the moments differ: the trials did not all stop at the same step
    assert len({n for _, n in checked}) > 5


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nereus", *args],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=REPO,
        timeout=120,
    )


def test_report_on_killed_writer_via_cli(tmp_path: Path) -> None:
    path = tmp_path / "killed.h5"
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(path)], stdout=subprocess.PIPE, text=True, env=ENV
    )
    assert proc.stdout is not None
    for _ in range(12):  # ready, steps 0..10
        proc.stdout.readline()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    res = _cli("report", str(path), "--json", "--no-plots")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["steps"] >= 11 and summary["closed"] is False


def test_report_summary_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.h5"
    _write_full(path, steps=6, gpus=20)  # > 16 GPUs: the memory plot is a heat map
    assert cli_main(["report", str(path), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["steps"] == 6 and s["mean_step_s"] == pytest.approx(4.5)
    assert s["median_step_s"] == pytest.approx(4.5)
    assert s["transitions"] == 1 and s["transfer_bytes"] == 123_456_789
    assert s["transition_share"] == pytest.approx(0.5 / (sum(2.0 + k for k in range(6)) + 0.5))
    assert s["admissions"] == {
        "urgent": {"admitted": 1, "rejected": 0},
        "opportunistic": {"admitted": 0, "rejected": 1},
    }
    assert s["events"] == {"run-start": 1, "node-failure": 1, "run-end": 1}
    assert [(p["first_step"], p["last_step"], p["plan_version"]) for p in s["plan_timeline"]] == [
        (0, 2, 0),
        (3, 5, 1),
    ]
    assert s["plan_timeline"][1]["plan"].startswith("actor-gen 1x1x2")
    out = tmp_path / "run_report"  # the default: next to the log
    assert [Path(p) for p in s["plots"]] == [
        out / n
        for n in ("step_latency.png", "plan_timeline.png", "gpu_memory.png", "transitions.png")
    ]
    for p in s["plots"]:
        data = Path(p).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000
    assert cli_main(["report", str(path)]) == 2  # the plot folder exists: never overwritten
    assert "--out=" in capsys.readouterr().err
    assert cli_main(["report", str(path), "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert "steps: 6 (step 0..5); mean 4.500 s, median 4.500 s" in text
    assert "urgent 1 admitted / 0 rejected" in text and "steps 3..5 (3): plan 1" in text


def _valid_log(tmp_path: Path) -> Path:
    path = tmp_path / "valid.h5"
    _write_full(path)
    return path


@pytest.mark.parametrize("keep", [0.0, 0.002, 0.5, 0.97, -1])
def test_truncated_file_one_line_exit_2(tmp_path: Path, keep: float) -> None:
    data = _valid_log(tmp_path).read_bytes()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(data[:-1] if keep == -1 else data[: int(len(data) * keep)])
    res = _cli("report", str(cut), "--no-plots")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert str(cut) in res.stderr
    assert ("truncated" in res.stderr) or ("not an HDF5 file" in res.stderr)


def _foreign_files(tmp_path: Path) -> dict[str, Path]:
    text = tmp_path / "notes.h5"
    text.write_text("step,mean,p95\n1,2,3\n")
    empty = tmp_path / "empty.h5"
    empty.write_bytes(b"")
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.arange(3)
    other110 = tmp_path / "other110.h5"
    with h5py.File(other110, "w", libver=("v110", "v110")) as f:
        f.create_dataset("steps", data=np.arange(3))
    future = tmp_path / "future.h5"
    _write_full(future)
    with h5py.File(future, "r+") as f:
        f.attrs[S.ATTR_VERSION] = np.int64(99)
    missing = tmp_path / "missing-table.h5"
    _write_full(missing)
    with h5py.File(missing, "r+") as f:
        del f["admissions"]
    return {
        "text": text,
        "empty": empty,
        "other": other,
        "other110": other110,
        "future": future,
        "missing": missing,
        "absent": tmp_path / "absent.h5",
    }


def test_foreign_files_one_line_exit_2(tmp_path: Path) -> None:
    expected = {
        "text": "not an HDF5 file",
        "empty": "not an HDF5 file",
        "other": "without the nereus-run-log schema",
        "other110": "without the nereus-run-log schema",
        "future": "schema version 99",
        "missing": "/admissions missing",
        "absent": "no such file",
    }
    files = _foreign_files(tmp_path)
    for name, path in files.items():
        with pytest.raises(LogFormatError, match=expected[name]):
            read_run_log(path)
    for name in ("text", "other", "future"):  # through the installed CLI entry point
        res = _cli("report", str(files[name]))
        assert res.returncode == 2, res.stderr
        assert res.stderr.count("\n") == 1 and expected[name] in res.stderr
        assert "Traceback" not in res.stderr


@pytest.mark.timeout(60)
def test_damaged_metadata_fails_fast(tmp_path: Path) -> None:
    """A SWMR reader retries bad checksums with backoff; ours gives up in well under a second."""
    assert swmr_fapl() is not None
    path = _valid_log(tmp_path)
    data = bytearray(path.read_bytes())
    data[2000:2400] = bytes(400)
    path.write_bytes(bytes(data))
    start = time.monotonic()
    with pytest.raises(LogFormatError):
        read_run_log(path)
    assert time.monotonic() - start < 10


def test_docs_list_every_table_and_column() -> None:
    doc = (REPO / "docs" / "log_schema.md").read_text()
    for t in S.TABLES:
        section = doc.split(f"### `/{t.name}`", 1)
        assert len(section) == 2, t.name
        body = section[1].split("###", 1)[0]
        for c in t.columns:
            assert f"| `{c.name}` |" in body, (t.name, c.name)
    attrs = (S.ATTR_FORMAT, S.ATTR_VERSION, S.ATTR_META_JSON, S.ATTR_CONFIG_JSON)
    for attr in (*attrs, S.ATTR_INITIAL_PLAN_JSON, S.ATTR_CREATED, S.ATTR_NEREUS_VERSION):
        assert f"attribute `{attr}`" in doc
    assert f"`/{S.HEAP}`" in doc


def test_reader_without_the_read_attempts_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where libhdf5 cannot be reached through ctypes, plain h5py SWMR opening is used."""
    import nereus.log.reader as reader

    monkeypatch.setattr(reader, "swmr_fapl", lambda: None)
    path = _valid_log(tmp_path)
    assert read_run_log(path).rows("steps") == 6
    cut = tmp_path / "cut.h5"
    cut.write_bytes(path.read_bytes()[:3000])
    with pytest.raises(LogFormatError, match="truncated"):
        read_run_log(cut)
