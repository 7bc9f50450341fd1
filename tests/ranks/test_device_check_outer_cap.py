"""The device check stopped by its outer cap (the shell's ``timeout`` sends SIGTERM) while a part
runs: it keeps the parts that finished in its summary, says it was stopped, kills the running
part's process with everything it started, and exits 124."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.paths import REPO

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_outer_cap_keeps_finished_parts_and_kills_the_running_one(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "benchmarks/device_check.py", "--dry-run",
                             "--parts", "a,c", "--out", str(tmp_path), "--scale", "6",
                             "--cap-s", "3000"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "CUDA_HOME": "/nonexistent"})
    log = tmp_path / "device_check.log"
    end = time.monotonic() + 800
    while time.monotonic() < end and proc.poll() is None:
        if log.exists() and "device_check_step.py" in log.read_text():
            break  # part (c) has started
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    said, _ = proc.communicate(timeout=60)
    assert proc.returncode == 124, said[-3000:]
    s = json.loads((tmp_path / "device_check.json").read_text())
    assert s["a"]["ok"] and "c" not in s and s["order"] == ["a"]
    assert s["stopped"].startswith("signal 15") and s["passed"] is False
    assert s["left_behind"] == []
    mark = f"NEREUS_DEVICE_CHECK_RUN={s['marker']}".encode()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                env = (d / "environ").read_bytes().split(b"\0")
                state = (d / "stat").read_text().split(") ", 1)[1][0]
            except (OSError, IndexError):
                continue
            assert mark not in env or state == "Z", f"pid {d.name} outlived the check"
