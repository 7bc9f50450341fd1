"""Surviving dead ranks: detect, revoke, shrink the MPI control plane (effectful).

Under Open MPI started with ``--with-ft ulfm`` an MPI call that involves a dead process raises
(``MPI_ERR_PROC_FAILED``) once the runtime has noticed the death; a gloo collective with a dead
peer raises at once ("Connection closed by peer"); a gloo collective whose live peer has left
for recovery raises when the group's timeout expires — that timeout (``runtime.timeout_s``) is
the bound on detection. Whatever the first error on a rank, it calls :func:`shrink`:
``Comm.Revoke`` makes every pending and later call on the old communicator fail on every rank
(so no rank waits in it), ``Comm.Shrink`` builds the communicator of the survivors (the same
relative order, so the lowest surviving rank is rank 0 of the new one: the new controller), and
a (framed) all-gather over it names the survivors by their original global ranks (GPU ids).

When nobody died (a plain bug on one rank), the shrunk communicator has every rank and the
caller treats the error as fatal, as before.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from nereus.errors import NereusError
from nereus.runtime.failures.relaunch import SHRINK_FAILED
from nereus.runtime.mpi.frames import allgather

SHRINK_ATTEMPTS = 5


class RankFailure(NereusError):
    """Ranks died and the survivors could not carry on (one line for the user)."""


@dataclass(frozen=True)
class Survivors:
    """The communicator of the surviving ranks and who they are."""

    comm: Any  # mpi4py.MPI.Intracomm over the survivors
    gpus: tuple[int, ...]  # original global ranks in new-communicator rank order
    lost: tuple[int, ...]  # original global ranks that died
    shrink_s: float


def ulfm_enabled(comm: Any) -> bool:
    """True when ``comm`` offers the ULFM calls (mpi4py ≥ 4) and Open MPI was started with
    fault tolerance on (``mpiexec --with-ft ulfm`` sets its MCA variable ``mpi_ft_enable``)."""
    import os

    on = os.environ.get("OMPI_MCA_mpi_ft_enable") == "1"  # noqa: SIM112 (Open MPI's own name)
    return on and all(hasattr(comm, name) for name in ("Revoke", "Shrink", "Agree"))


def secondary(exc: BaseException) -> bool:
    """Whether ``exc`` looks like the consequence of a dead peer (an MPI error on the control
    plane, a frame that is short, torn or not agreed because its sender died while sending it —
    :class:`nereus.runtime.mpi.frames.FrameError`, a CommunicationError —, a gloo connection
    error or timeout), not a fault of this rank's own code."""
    import torch.distributed as dist
    from mpi4py import MPI

    from nereus.errors import CommunicationError, TransitionError

    if isinstance(exc, MPI.Exception | dist.DistError | CommunicationError | TransitionError):
        return True
    text = str(exc)
    return any(s in text for s in ("Connection closed by peer", "Connection reset by peer",
                                   "Timed out waiting", "Broken pipe", "Connection refused",
                                   "revoked", "Socket Timeout", "failed to recv", "gloo"))


def shrink(comm: Any, global_rank: int, world_gpus: tuple[int, ...]) -> Survivors:
    """Revoke ``comm`` and build the survivors' communicator (collective over the survivors).

    ``world_gpus``: the original global ranks of ``comm``'s members, in its rank order."""
    t0 = time.perf_counter()
    last: Exception | None = None
    for _ in range(SHRINK_ATTEMPTS):
        with contextlib.suppress(Exception):  # already revoked by another rank
            comm.Revoke()
        try:
            new = comm.Shrink()
        except Exception as exc:
            last = exc
            continue
        try:
            gpus = tuple(int(g) for g in allgather(new, global_rank, "shrink"))
        except Exception as exc:  # another rank died during the shrink: shrink again
            last, comm = exc, new
            continue
        lost = tuple(sorted(set(world_gpus) - set(gpus)))
        return Survivors(new, gpus, lost, time.perf_counter() - t0)
    raise RankFailure(f"{SHRINK_FAILED}: {last}")
