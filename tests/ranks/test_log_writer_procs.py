"""HDF5 run log with real writer processes: a SWMR reader while a child writes, kill -9 of writers,
and bad files through the console entry (``nereus report`` as a child process)."""

from __future__ import annotations

import json
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
from support.log_files import PNG_MAGIC, valid_log, write_full_log
from support.log_writer_proc import STAGES, expected_peak_bytes, expected_step_s
from support.paths import SUPPORT

from nereus.cli import main as cli_main
from nereus.errors import LogFormatError
from nereus.log import schema as S
from nereus.log.reader import read_run_log

REPO = Path(__file__).resolve().parents[2]
WRITER = SUPPORT / "log_writer_proc.py"
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_concurrent_reader_sees_rows_grow(tmp_path: Path) -> None:
    path = tmp_path / "live.h5"
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(path), "--steps", "24", "--sleep", "0.03",
         "--pause-every", "4"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert proc.stdout is not None and proc.stdin is not None
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
                proc.stdin.write("go\n")  # the writer waited, holding the file open
                proc.stdin.flush()
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


@pytest.mark.parametrize("keep", [0.0, 0.002, 0.5, 0.97, -1])
def test_truncated_file_one_line_exit_2(tmp_path: Path, keep: float) -> None:
    data = valid_log(tmp_path).read_bytes()
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
    write_full_log(future)
    with h5py.File(future, "r+") as f:
        f.attrs[S.ATTR_VERSION] = np.int64(99)
    missing = tmp_path / "missing-table.h5"
    write_full_log(missing)
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
