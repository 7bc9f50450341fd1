"""Growing a running job: ranks for nodes granted later join at a safe boundary (effectful).

MPI-2 dynamic processes: the running ranks call ``MPI_Comm_spawn`` (collective, rank 0 roots)
for the new node's ranks — placed with the ``host`` info key when the launcher names hosts — and
merge the inter-communicator into one intra-communicator in which the old ranks keep their
numbers (``Merge(high=False)``) and the new ones follow in order, so a GPU id stays the MPI rank.
The torch.distributed default group cannot take new members: every rank then joins a fresh
rendezvous generation on the merged communicator and the units of the next plan are built from
the global state gathered before the spawn (the gather+reload path). Rank 0 hands the spawned
ranks the target plan, the run's options, the state and the boundary in one framed message of
plain data (:mod:`nereus.runtime.mpi.frames`); they read the job's setup from the same config.

At the end of the job every link is released (the merged communicator freed, the
inter-communicator disconnected, newest first); Open MPI crashes in ``MPI_Finalize`` otherwise.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nereus.errors import CommunicationError, TransitionError
from nereus.runtime.mpi.frames import bcast
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan


@dataclass
class Links:
    """The (merged, inter) communicator pairs this rank holds, oldest first."""

    pairs: list[tuple[Any, Any]] = field(default_factory=list)

    def release(self) -> None:
        while self.pairs:
            merged, inter = self.pairs.pop()
            merged.Free()
            inter.Disconnect()


def spawn_joiners(comm: Any, n_new: int, argv: Sequence[str], hosts: Sequence[str] = ()
                  ) -> tuple[Any, Any]:
    """Every current rank: start ``n_new`` ranks running ``argv``; returns (the merged
    communicator — old ranks first, in their order —, the inter-communicator)."""
    from mpi4py import MPI

    info = MPI.Info.Create()
    if hosts:
        info.Set("host", ",".join(hosts))
    try:
        inter = comm.Spawn(argv[0], args=list(argv[1:]), maxprocs=n_new, info=info, root=0)
    except MPI.Exception as e:
        raise CommunicationError(f"MPI_Comm_spawn of {n_new} ranks failed: {e}") from e
    finally:
        info.Free()
    return inter.Merge(high=False), inter


def join_parent(links: Links) -> Any | None:
    """A spawned rank: the merged communicator with the running job, or None when this process
    was not spawned."""
    from mpi4py import MPI

    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        return None
    merged = parent.Merge(high=True)
    links.pairs.append((merged, parent))
    return merged


def joiner_argv(worker_argv: Sequence[str]) -> list[str]:
    """The command line of a joining rank: the same worker (it finds its parent job itself)."""
    return [sys.executable, "-m", "nereus.runtime.worker.main", *worker_argv]


class Grown(Exception):
    """Raised on every old rank once the late ranks joined: ``_run`` starts again on ``comm``
    from ``FailureHandler.resume`` (the same restart the survivors of a failure take)."""

    def __init__(self, comm: Any, inter: Any) -> None:
        super().__init__("grown")
        self.comm = comm
        self.inter = inter


def grow(comm: Any, units: Any, ft: Any, plan: ExecutionPlan, pool: Sequence[int], step: int, *,
         worker_argv: Sequence[str]) -> tuple[Any, Any]:
    """Every running rank, at the boundary after ``step``: the controller's target ``plan`` uses
    GPUs whose ranks do not exist yet. Gather the global state, drop the data plane, spawn the
    ranks, hand them the state and return (merged communicator, inter-communicator); the
    caller raises :class:`Grown`."""
    import torch.distributed as dist

    from nereus.runtime.execution.gather_reload import gather_state
    from nereus.runtime.failures.boundary import BoundaryBook
    from nereus.runtime.failures.recovery import Resume

    t0 = time.time()
    world = comm.Get_size()
    new = sorted(g for g in pool if g >= world)
    if new != list(range(world, world + len(new))):
        raise TransitionError(f"late GPUs {new} do not follow the running ranks 0..{world - 1}")
    globs, counters, _ = gather_state(units, comm, tuple(range(world)))
    units.destroy()
    ft.units = None
    dist.destroy_process_group()  # the default group cannot take new members
    merged, inter = spawn_joiners(comm, len(new), joiner_argv(worker_argv))
    first_new = max(ft.original) + 1
    original = tuple(ft.original) + tuple(range(first_new, first_new + len(new)))
    generation = ft.generation + 1
    package = None
    if merged.Get_rank() == 0:  # plain data: the joiners read the same config themselves
        package = {"nodes": ft.setup.cluster.nodes, "rc": ft.rc.to_dict(),
                   "late_ranks": ft.rc.late_ranks, "plan": plan.to_dict(), "globs": globs,
                   "counters": {ms: [vars(c), adam] for ms, (c, adam) in counters.items()},
                   "step": step + 1, "generation": generation, "original": list(original)}
    bcast(merged, package, 0, "growth")
    event = {"kind": "growth", "joined_ranks": new, "resume_step": step + 1,
             "gathered_bytes": sum(int(a.nbytes) for g in globs.values() for d in g.values()
                                   for a in d.values())}
    ft.resume = Resume(ft.setup, ft.rc, plan, globs, counters, step + 1, generation,
                       ctl=ft.ctl, recorder=ft.recorder, event=event, t_detect=t0)
    ft.generation, ft.original, ft.book = generation, original, BoundaryBook()
    return merged, inter


def joined(comm: Any, ft: Any, setup: Setup) -> None:
    """A spawned rank: take the running job's state from rank 0 into ``ft.resume``. ``setup``:
    the job's setup as this rank read it from the config (the running job's may have another
    node count)."""
    from nereus.config.run import RunConfig
    from nereus.runtime.failures.recovery import Resume
    from nereus.runtime.worker.state import Counters

    p = bcast(comm, None, 0, "growth")
    setup = replace(setup, cluster=replace(setup.cluster, nodes=int(p["nodes"])))
    rc = replace(RunConfig.from_dict(p["rc"]), late_ranks=int(p["late_ranks"]))
    counters = {ms: (Counters(**c), float(adam)) for ms, (c, adam) in p["counters"].items()}
    ft.resume = Resume(setup, rc, ExecutionPlan.from_dict(p["plan"]), p["globs"], counters,
                       int(p["step"]), int(p["generation"]), event={"kind": "growth"},
                       t_detect=time.time())
    ft.generation, ft.original = int(p["generation"]), tuple(int(g) for g in p["original"])
