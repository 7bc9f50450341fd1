"""The prepared device check (benchmarks/device_check.sh) on the CPU: its dry run runs every part
the GPU run will, in the GPU run's order (a, c, b), each after its own prerequisites, and passes;
with a rank of part (b) stopped (``--induce-hang``) it still records parts (a) and (c) — in the
summary before (b) even starts waiting — kills the hung run with everything it started, and
leaves no process behind.

``DEVICE_CHECK_SCALE`` stretches the time-outs for this 2-core machine (shared with the rest of
the suite); on the GPU machine they are the script's own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from support.paths import REPO

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs mpiexec")]

MARK = "NEREUS_DEVICE_CHECK_RUN"


def _start(out: Path, *flags: str, scale: float) -> subprocess.Popen[str]:
    return subprocess.Popen(["bash", "benchmarks/device_check.sh", "--dry-run", *flags],
                            cwd=REPO, env={**os.environ, "OUT": str(out),
                                           "DEVICE_CHECK_SCALE": str(scale)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _marked(token: str) -> list[int]:
    """Live processes carrying the check's marker (none may outlive it)."""
    want = f"{MARK}={token}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if want in (d / "environ").read_bytes().split(b"\0") and \
                        (d / "stat").read_text().split(") ", 1)[1][0] != "Z":
                    found.append(int(d.name))
            except (OSError, IndexError):
                continue
    return found


def _summary(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "device_check.json").read_text()))


@pytest.mark.timeout(2000)
def test_device_check_dry_run_passes(tmp_path: Path) -> None:
    proc = _start(tmp_path, scale=4)
    said, _ = proc.communicate(timeout=1900)
    assert proc.returncode == 0, said[-4000:]
    s = _summary(tmp_path)
    assert s["dry_run"] is True and s["passed"] is True
    assert s["order"] == ["a", "c", "b"]
    assert s["prerequisites"]["missing"] == {"a": [], "c": [], "b": []}
    assert s["a"]["ok"] and s["a"]["correct"] and s["a"]["bandwidth_rows"] > 0
    c = s["c"]
    assert c["ok"] and c["reference"].startswith("transformers") and c["labels_follow_logits"]
    assert c["grad_worst_share_of_tolerance"] < 1 and c["loss_rel_diff"] <= 1e-5
    assert s["b"]["one_rank"]["ok"] and s["b"]["four_ranks_shared"]["ok"]
    log = (tmp_path / "device_check.log").read_text()
    assert log.startswith("== environment probe")
    assert log.index("part a: ok") < log.index("part c: ok") < log.index("part b: ok")
    assert s["left_behind"] == [] and _marked(s["marker"]) == []


@pytest.mark.timeout(1500)
def test_induced_hang_in_part_b_keeps_a_and_c_and_leaves_nothing(tmp_path: Path) -> None:
    proc = _start(tmp_path, "--induce-hang", scale=3)
    log = tmp_path / "device_check.log"
    during = None
    end = time.monotonic() + 1400
    while proc.poll() is None and time.monotonic() < end:
        if during is None and log.exists() and "induced hang: rank process" in log.read_text():
            during = _summary(tmp_path)  # while part (b) hangs
        time.sleep(0.5)
    said, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, said[-4000:]
    assert during is not None, said[-4000:]
    assert during["order"] == ["a", "c"] and during["a"]["ok"] and during["c"]["ok"]
    assert "b" not in during
    s = _summary(tmp_path)
    assert s["order"] == ["a", "c", "b"] and s["a"]["ok"] and s["c"]["ok"]
    b = s["b"]
    assert not b["ok"] and b["one_rank"]["timed_out"] and not b["one_rank"]["ok"]
    assert b["four_ranks_shared"]["skipped"] == "after the one-rank run hung"
    assert "timed out after" in log.read_text()
    assert s["left_behind"] == [] and _marked(s["marker"]) == []
    assert s["passed"] is False
