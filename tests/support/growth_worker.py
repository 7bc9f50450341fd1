"""2 ranks spawn 2 more at a boundary; all 4 form one communicator and one torch.distributed
group (a new rendezvous generation, its store file in the folder of the first, which the spawned
ranks learn from the rendezvous message) and sum their ranks; every rank prints
GROWN <rank> <sum> joined=<spawned?> folder=<the store folder>; the folder is removed at the end."""

from __future__ import annotations

import sys

from mpi4py import MPI

from nereus.runtime.mpi.growth import Links, join_parent, spawn_joiners
from nereus.runtime.mpi.plane import ControlPlane
from nereus.runtime.mpi.rendezvous import StoreFolder, finish, rendezvous


def main() -> int:
    import torch
    import torch.distributed as dist

    links = Links()
    comm = join_parent(links)
    joined = comm is not None
    folder = StoreFolder()
    if comm is None:  # an original rank: a first generation of its own, then grow
        world = MPI.COMM_WORLD
        rendezvous(ControlPlane(world), folder, 0, timeout_s=30.0)
        dist.destroy_process_group()  # the default group cannot take new members
        comm, inter = spawn_joiners(world, 2, [sys.executable, __file__])
        links.pairs.append((comm, inter))
    plane = ControlPlane(comm)
    rendezvous(plane, folder, 1, timeout_s=30.0)
    x = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(x)
    print(f"GROWN {comm.Get_rank()} {int(x.item())} joined={joined} folder={folder.path}",
          flush=True)
    dist.destroy_process_group()
    finish(comm, folder, plane.is_root)
    links.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
