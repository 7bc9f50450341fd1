"""A full disk (a real, small tmpfs mounted for the test; root only) ends a command in one line
and leaves no partial file: ``simulate --log/--save-calibration``, ``report --out`` and the run
log writer, which stops before HDF5 meets the full file system (nereus.log.writer.check_space)
and leaves the log readable up to its last complete step."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.bad_inputs import SPOT
from support.paths import REPO

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None,
                                reason="mounting a small tmpfs needs root and mount(8)")
H200 = REPO / "examples" / "ppo-llama8b-h200.yaml"


@contextlib.contextmanager
def _small_fs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _nereus(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nereus", *argv], capture_output=True,
                          text=True, cwd=REPO, timeout=300)


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return lines[0]


def test_simulate_outputs_on_a_full_disk_leave_nothing(tmp_path: Path) -> None:
    with _small_fs(tmp_path / "fs", "64k") as fs:
        (fs / "filler").write_bytes(b"\0" * 48 * 1024)  # what other jobs left there
        proc = _nereus("simulate", str(H200), "--gpu-trace", str(SPOT), "--length-trace",
                       "paper:25-step", "--steps", "25", "--log", str(fs / "sim.h5"),
                       "--save-calibration", str(fs / "calib.json"), "--json")
        line = _one_line(proc)
        assert "No space left on device" in line or "free" in line, line
        assert sorted(p.name for p in fs.iterdir()) == ["filler"]  # no partial file


def test_report_on_a_full_disk_leaves_no_folder(tmp_path: Path) -> None:
    log = tmp_path / "sim.h5"
    ok = _nereus("simulate", str(H200), "--gpu-trace", str(SPOT), "--length-trace",
                 "paper:25-step", "--steps", "25", "--log", str(log), "--json")
    assert ok.returncode == 0, ok.stderr[-2000:]
    with _small_fs(tmp_path / "fs", "96k") as fs:
        proc = _nereus("report", str(log), "--out", str(fs / "plots"))
        line = _one_line(proc)
        assert "plots" in line, line
        assert list(fs.iterdir()) == []  # no folder, no temporary folder, no partial plot


def test_the_run_log_writer_stops_before_the_disk_is_full(tmp_path: Path) -> None:
    from nereus.errors import NereusError
    from nereus.log.reader import read_run_log
    from nereus.log.writer import MIN_FREE_BYTES, LogWriteError, RunLogWriter

    size_kib = (MIN_FREE_BYTES + (2 << 20)) // 1024
    with _small_fs(tmp_path / "fs", f"{size_kib}k") as fs:
        path = fs / "run.h5"
        writer = RunLogWriter(path, {"kind": "test"}, {"argv": []})
        blob = "x" * 200_000  # a large JSON detail per step: the disk fills within steps
        steps = 0
        with pytest.raises(LogWriteError) as err:
            for step in range(1000):
                writer.log_event(step, "detail", {"blob": blob})
                writer.log_step(step, step_s=1.0, gen_len_mean=1.0, pool_gpus=1,
                                wall_time_s=float(step))
                steps = step + 1
        assert isinstance(err.value, NereusError) and "\n" not in str(err.value)
        assert 0 < steps < 1000
        free = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize
        assert free > 0  # stopped before the file system was full
        log = read_run_log(path)  # the log is whole up to the rows written before the stop
        assert len(log.steps) >= steps - 1
