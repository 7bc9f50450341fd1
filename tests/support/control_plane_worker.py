"""Run under mpiexec by tests/mpi/test_control_plane_mpi.py: exercises the real MPI control plane."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from mpi4py import MPI

from nereus.errors import CommunicationError
from nereus.runtime.mpi.plane import ControlPlane, Message
from nereus.runtime.mpi.rendezvous import StoreFolder, finish, rendezvous, teardown


def main() -> int:
    plane = ControlPlane(MPI.COMM_WORLD)
    r = plane.global_rank
    plan = {"stages": [{"name": "actor-train", "tp": 2}]}
    got = plane.broadcast(Message("plan", 1, plan) if plane.is_root else None, "plan")
    assert got.payload == plan and got.seq == 1
    gathered = plane.gather({"rank": r, "step_s": 0.5 * r})
    if plane.is_root:
        assert gathered is not None and [g["rank"] for g in gathered] == list(range(plane.world_size))
    plane.agree(True)
    failing = int(sys.argv[1])
    try:
        plane.agree(r != failing, f"simulated failure on rank {r}")
        print(f"rank {r}: NO ERROR", flush=True)
        return 1
    except CommunicationError as exc:
        print(f"rank {r}: {exc}", flush=True)
    folder = StoreFolder()
    rendezvous(plane, folder, 1, timeout_s=30)
    t = torch.tensor([float(r + 1)])
    dist.all_reduce(t)
    assert t.item() == sum(range(1, plane.world_size + 1))
    teardown()
    rendezvous(plane, folder, 2, timeout_s=30)
    teardown()
    finish(plane.comm, folder, plane.is_root)
    print(f"rank {r}: OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
