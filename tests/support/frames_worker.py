"""Run under ``mpiexec --with-ft ulfm`` by tests/mpi/test_frames_mpi.py: a framed message whose
sender's node dies at a chosen point (``NEREUS_TEST_FRAME_KILL``), then the survivors recover.

``frames_worker.py PRIMITIVE``: PRIMITIVE is ``bcast`` (rank 0 sends) or ``allgather`` (every
rank sends). Every rank takes part in ``probe`` messages until one raises; every message a
survivor gets back must be the one that was sent, byte for byte (a survivor never gets a partial
message). The error must be what the runtime survives (an MPI error or a FrameError, both
``secondary``). The survivors then revoke and shrink the communicator with the runtime's own
:func:`nereus.runtime.failures.ulfm.shrink` and exchange one more message on it, which must
arrive intact. Each survivor prints one line:
``SURVIVOR <rank> error=<type> returned=<n> lost=<r,r,..> after=ok``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import numpy as np
from mpi4py import MPI

from nereus.errors import CommunicationError
from nereus.runtime.failures.ulfm import shrink
from nereus.runtime.mpi.frames import allgather, bcast

ROUNDS = 4


def message(seq: int, rank: int) -> dict[str, Any]:
    """What ``rank`` sends as message ``seq``: structure and an array big enough to travel in
    many TCP segments."""
    x = np.arange(50_000, dtype=np.float32) * (seq + 1) + rank
    return {"seq": seq, "rank": rank, "plan": {"stages": [[rank, seq]] * 3}, "x": x}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return bool(a == b)


def send(comm: Any, primitive: str, seq: int) -> None:
    """One ``probe`` message; exits with status 3 when what came back is not what was sent."""
    me, size = comm.Get_rank(), comm.Get_size()
    if primitive == "bcast":
        got = bcast(comm, message(seq, 0) if me == 0 else None, 0, "probe")
        ok = same(message(seq, 0), got)
    else:
        got = allgather(comm, message(seq, me), "probe")
        ok = len(got) == size and all(same(message(seq, r), g) for r, g in enumerate(got))
    if not ok:
        print(f"BAD rank {MPI.COMM_WORLD.Get_rank()}: message {seq} came back altered",
              flush=True)
        os._exit(3)


def main() -> int:
    primitive = sys.argv[1]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    returned, error = 0, ""
    for seq in range(ROUNDS):
        try:
            send(comm, primitive, seq)
            returned += 1
        except (MPI.Exception, CommunicationError) as e:  # what `secondary` survives
            error = type(e).__name__
            break
    if not error:
        print(f"NO FAILURE rank {rank}", flush=True)
        os._exit(4)
    surv = shrink(comm, rank, tuple(range(comm.Get_size())))
    send(surv.comm, primitive, 100)  # the survivors' communicator carries messages again
    lost = ",".join(str(g) for g in surv.lost)
    print(f"SURVIVOR {rank} error={error} returned={returned} lost={lost} after=ok", flush=True)
    # No survivor leaves before every survivor's message is done: a process that exits can
    # take the last bytes it sent with it, and its peer would see a third failure.
    with contextlib.suppress(MPI.Exception):
        surv.comm.Barrier()
    os._exit(0)  # under ULFM MPI_Finalize can wait forever with a dead rank


if __name__ == "__main__":
    sys.exit(main())
