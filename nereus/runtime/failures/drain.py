"""A node that leaves with notice: its ranks exit for real at a step boundary (effectful).

An event ``{at_step: s, drain_node: n}`` takes node n's GPUs out of the controller's pool after
step s, like ``remove_node``: the plan change that follows moves every unit off the node through
the transition DAG. At the next boundary rank 0 names the node's ranks in the ``step`` message
(:meth:`nereus.runtime.rank0.loop.RankZero.leaving`); those ranks release their groups and exit
(status 0, without ``MPI_Finalize``, which waits for every rank of the job), so no process of
the job is left on the node. The ranks that stay take the survivors' path of ULFM
(:mod:`nereus.runtime.failures.recovery`): ``Comm.Shrink`` to themselves, renumbered, units
rebuilt from their own replicas (every unit is on them already), the log going on with a
``rank-failure`` event marked ``drained``. It needs the job to run under ULFM (``nereus run``
starts mpiexec ``--with-ft ulfm``); otherwise the node's ranks stay (only its GPUs leave the
pool), as for ``remove_node``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from nereus.errors import CommunicationError


class Drained(CommunicationError):
    """Raised on the ranks that stay once a drained node's ranks exited at this boundary."""


def leave_or_raise(rank: int, leave: Sequence[int], ft: Any, units: Any, dev: Any) -> None:
    """Every rank, when the ``step`` message names ``leave``: a leaving rank releases what it
    holds and ends its process; the others raise :class:`Drained` (the failure path shrinks
    the job to them)."""
    if rank in leave:
        ft.disarm()
        ft.preempt.done()
        units.destroy()
        dev.destroy()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # MPI_Finalize would wait for the ranks that go on
    ft.drained = list(leave)
    raise Drained(f"ranks {list(leave)} of drained nodes left at this boundary")
