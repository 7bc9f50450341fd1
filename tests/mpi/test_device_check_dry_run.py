"""The prepared device check (benchmarks/device_check.sh) passes its dry run on CPU: every part
it would run on a GPU runs here on the CPU paths, so the script is ready when a GPU is lent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.paths import REPO

pytestmark = [pytest.mark.mpi, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs mpiexec")]


@pytest.mark.timeout(900)
def test_device_check_dry_run_passes(tmp_path: Path) -> None:
    res = subprocess.run(["bash", "benchmarks/device_check.sh", "--dry-run"], cwd=REPO,
                         env={**os.environ, "OUT": str(tmp_path)}, capture_output=True,
                         text=True, timeout=840)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((tmp_path / "device_check.json").read_text())
    assert summary["dry_run"] is True
    assert summary["a"]["ok"] and summary["prerequisites"]["missing"] == []
