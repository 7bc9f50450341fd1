"""Growing a running job: ranks for nodes granted later join at a safe boundary (effectful).

MPI-2 dynamic processes: the running ranks call ``MPI_Comm_spawn`` (collective, rank 0 roots)
for the new node's ranks — placed with the ``host`` info key when the launcher names hosts — and
merge the inter-communicator into one intra-communicator in which the old ranks keep their
numbers (``Merge(high=False)``) and the new ones follow in order, so a GPU id stays the MPI rank.
The torch.distributed default group cannot take new members: every rank keeps a host copy of
its own shards, drops its groups, and after the spawn joins a fresh rendezvous generation on the
merged communicator; there the old ranks rebuild their units of the running plan from those
copies and every rank runs the controller's transition DAG (:func:`extend`): Extend (and Split /
Merge) primitives give the joined ranks their state from the existing replicas. When the order
has no DAG (no replica to extend from, or no order fits memory) the global state is gathered
before the spawn instead and the next plan's units are built from it (the gather+reload path;
the log's transition row says why). Rank 0 hands the spawned ranks the order, the run's options
and the boundary (and the state, on the fallback) in one framed message of plain data
(:mod:`nereus.runtime.mpi.frames`); they read the job's setup from the same config.

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


def grow(comm: Any, units: Any, ft: Any, order: Any, step: int, *,
         worker_argv: Sequence[str]) -> tuple[Any, Any]:
    """Every running rank, at the boundary after ``step``: the controller's order (a
    :class:`~nereus.transition.order.PlanChangeOrder`) targets a plan on GPUs whose ranks do
    not exist yet. With a transition DAG, each rank keeps a host copy of its own shards (no
    communication); without one (no replica to extend from, or no order fits memory) the global
    state is gathered. Then drop the data plane, spawn the ranks, hand them the order and the
    boundary and return (merged communicator, inter-communicator); the caller raises
    :class:`Grown`."""
    import torch.distributed as dist

    from nereus.runtime.execution.gather_reload import gather_state, state_bytes
    from nereus.runtime.failures.boundary import BoundaryBook
    from nereus.runtime.failures.recovery import Resume
    from nereus.runtime.worker.units import local_copy, release_units

    t0 = time.time()
    world = comm.Get_size()
    new = sorted(g for g in order.pool if g >= world)
    if new != list(range(world, world + len(new))):
        raise TransitionError(f"late GPUs {new} do not follow the running ranks 0..{world - 1}")
    source = units.plan
    local: dict[Any, Any] = {}
    globs: dict[str, Any] = {}
    counters: dict[str, Any] = {}
    if order.dag is not None:  # the DAG extends the old ranks' units onto the new ones
        held = units.handover()
        local = {emu: local_copy(st) for emu, st in held.items()}
        units.destroy()
        release_units(list(held.values()))
        del held
    else:
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
                   "late_ranks": ft.rc.late_ranks, "plan": order.target.to_dict(),
                   "globs": globs, "order": order.to_wire() if order.dag is not None else None,
                   "source": source.to_dict(),
                   "counters": {ms: [vars(c), adam] for ms, (c, adam) in counters.items()},
                   "step": step + 1, "generation": generation, "original": list(original)}
    bcast(merged, package, 0, "growth")
    event = {"kind": "growth", "joined_ranks": new, "resume_step": step + 1,
             "executor": "dag" if order.dag is not None else "gather-reload",
             "reason": order.reason, "gathered_bytes": state_bytes(globs)}
    ft.resume = Resume(ft.setup, ft.rc, order.target, globs, counters, step + 1, generation,
                       ctl=ft.ctl, recorder=ft.recorder, event=event, t_detect=t0,
                       source=source, order=order if order.dag is not None else None,
                       local=local)
    ft.generation, ft.original, ft.book = generation, original, BoundaryBook()
    return merged, inter


def extend(comm: Any, res: Any, rank: int, timeout_s: float, lr: float, store: Any,
           device: Any) -> tuple[Any, Any]:
    """Every rank of the grown job, after its rendezvous: the old ranks' units of the source
    plan rebuilt on the new groups from their own shards, then the order's transition DAG run
    on the merged job (its Extend / Split / Merge primitives give the joined ranks their
    state from the existing replicas). Returns (the target plan's units, the PlanChange)."""
    from nereus.runtime.execution.plan_change import change_plan
    from nereus.runtime.worker.units import PlanUnits

    units = PlanUnits(res.setup, res.source, rank, timeout_s, lr, {}, {}, store, "grow",
                      device=device, local=res.local)
    res.local = {}  # the host copies are in the units now
    return change_plan(comm, units, res.order, store, 0, lr=lr)


def joined(comm: Any, ft: Any, setup: Setup) -> None:
    """A spawned rank: take the running job's order (or state) from rank 0 into ``ft.resume``.
    ``setup``: the job's setup as this rank read it from the config (the running job's may have
    another node count)."""
    from nereus.config.run import RunConfig
    from nereus.runtime.failures.recovery import Resume
    from nereus.runtime.worker.state import Counters
    from nereus.transition.order import PlanChangeOrder

    p = bcast(comm, None, 0, "growth")
    setup = replace(setup, cluster=replace(setup.cluster, nodes=int(p["nodes"])))
    rc = replace(RunConfig.from_dict(p["rc"]), late_ranks=int(p["late_ranks"]))
    counters = {ms: (Counters(**c), float(adam)) for ms, (c, adam) in p["counters"].items()}
    order = None if p["order"] is None else PlanChangeOrder.from_wire(p["order"])
    ft.resume = Resume(setup, rc, ExecutionPlan.from_dict(p["plan"]), p["globs"], counters,
                       int(p["step"]), int(p["generation"]), event={"kind": "growth"},
                       t_detect=time.time(), source=ExecutionPlan.from_dict(p["source"]),
                       order=order)
    ft.generation, ft.original = int(p["generation"]), tuple(int(g) for g in p["original"])
