"""Growing a running job: ranks for nodes granted later join at a safe boundary (effectful).

MPI-2 dynamic processes: the running ranks call ``MPI_Comm_spawn`` (collective, rank 0 roots)
for the new node's ranks — placed with the ``host`` info key when the launcher names hosts — and
merge the inter-communicator into one intra-communicator in which the old ranks keep their
numbers (``Merge(high=False)``) and the new ones follow in order, so a GPU id stays the MPI rank.
The torch.distributed default group cannot take new members: every rank then joins a fresh
rendezvous generation on the merged communicator and the units of the next plan are built from
the global state gathered before the spawn (the gather+reload path).

At the end of the job every link is released (the merged communicator freed, the
inter-communicator disconnected, newest first); Open MPI crashes in ``MPI_Finalize`` otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nereus.errors import CommunicationError
from nereus.spec.job import Setup


@dataclass
class Links:
    """The (merged, inter) communicator pairs this rank holds, oldest first."""

    pairs: list[tuple[Any, Any]] = field(default_factory=list)

    def release(self) -> None:
        while self.pairs:
            merged, inter = self.pairs.pop()
            merged.Free()
            inter.Disconnect()


def spawn_joiners(comm: Any, n_new: int, argv: Sequence[str], links: Links,
                  hosts: Sequence[str] = ()) -> Any:
    """Every current rank: start ``n_new`` ranks running ``argv`` and return the merged
    communicator (old ranks first, in their order)."""
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
    merged = inter.Merge(high=False)
    links.pairs.append((merged, inter))
    return merged


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


def grown_setup(setup: Setup, nodes: int) -> Setup:
    """The setup once the cluster has ``nodes`` nodes (GPU ids of new nodes follow the old)."""
    if nodes < setup.cluster.nodes:
        raise ValueError(f"a grown cluster has {nodes} < {setup.cluster.nodes} nodes")
    return replace(setup, cluster=replace(setup.cluster, nodes=nodes))


def joiner_argv(worker_argv: Sequence[str]) -> list[str]:
    """The command line of a joining rank: the same worker, told it joins."""
    return [sys.executable, "-m", "nereus.runtime.worker", *worker_argv, "--joined"]
