"""Run on 3 MPI ranks by tests/mpi/test_rendezvous_mpi.py: the rendezvous through the job-private
file store, watched from /proc. Prints one JSON line per phase and rank:

- ``BAD``: a given store folder that others may enter is refused by every rank alike;
- ``GEN1``: generation 1 of all ranks — the listening sockets each rank gained (the group's own
  gloo sockets only), an all-reduce, a registered group and a transition group of ranks {0, 2}
  (its own rendezvous in the same file), the folder's and file's modes;
- ``GEN2``: generation 2 of ranks {1, 2} only, as after rank 0 died: rooted by old rank 1, which
  learnt the folder from generation 1's message; the old file is gone, an all-reduce works;
- ``CONTROL``: the old ``init_method="tcp://…"`` rendezvous watched the same way (what the probe
  sees when a store does listen);
- ``DONE``: after :func:`finish` (the folder should be gone).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from nereus.errors import CommunicationError
from nereus.runtime.execution.groups import transition_group
from nereus.runtime.mpi.plane import ControlPlane
from nereus.runtime.mpi.rendezvous import StoreFolder, finish, rendezvous, teardown
from support.sockets import listening

TIMEOUT_S = 30.0


def say(tag: str, **data: Any) -> None:
    print(f"{tag} {json.dumps(data, sort_keys=True)}", flush=True)


def mode_of(path: str) -> str:
    return f"{os.stat(path).st_mode & 0o7777:04o}"


def main() -> int:
    warnings.filterwarnings("ignore")
    comm = MPI.COMM_WORLD
    plane = ControlPlane(comm)
    r, n = plane.global_rank, plane.world_size
    open_folder = sys.argv[1]  # made by the test with mode 0755

    try:
        rendezvous(plane, StoreFolder(open_folder), 0, timeout_s=TIMEOUT_S)
        say("BAD", rank=r, error="")
    except CommunicationError as e:
        say("BAD", rank=r, error=str(e), left=sorted(os.listdir(open_folder)))

    folder = StoreFolder()
    before = listening()
    info = rendezvous(plane, folder, 1, timeout_s=TIMEOUT_S)
    opened = listening() - before
    t = torch.tensor([float(r + 1)])
    dist.all_reduce(t)
    g = dist.new_group(list(range(n)), timeout=timedelta(seconds=TIMEOUT_S))
    u = torch.tensor([1.0])
    dist.all_reduce(u, group=g)
    pair = -1.0
    if r in (0, 2):  # a transition group: only its members, its own keys in the same store
        tg = transition_group(dist.distributed_c10d._get_default_store(), "gen1/t0", (0, 2), r,
                              TIMEOUT_S)
        v = torch.tensor([float(r)])
        tg.pg.allreduce([v]).wait()
        pair = v.item()
        del tg
    say("GEN1", rank=r, opened=sorted(str(x) for x in opened),
        wildcard=any(x.wildcard for x in opened), sum=t.item(), group=u.item(), pair=pair,
        folder=folder.path, owned=folder.owned, folder_mode=mode_of(folder.path),
        file=info.path, file_mode=mode_of(info.path), generation=info.generation)
    del g
    teardown()
    comm.Barrier()

    sub = comm.Split(0 if r else MPI.UNDEFINED, r)  # rank 0 "lost": ranks 1 and 2 go on
    if r:
        plane2 = ControlPlane(sub)
        before = listening()
        info2 = rendezvous(plane2, folder, 2, timeout_s=TIMEOUT_S)
        opened = listening() - before
        x = torch.tensor([float(r)])
        dist.all_reduce(x)
        say("GEN2", rank=r, root=plane2.is_root, sum=x.item(), world=dist.get_world_size(),
            opened=sorted(str(o) for o in opened), wildcard=any(o.wildcard for o in opened),
            old_file_left=os.path.exists(info.path), file=info2.path,
            same_folder=os.path.dirname(info2.path) == os.path.dirname(info.path))
        teardown()
        sub.Free()
    comm.Barrier()

    port = np.zeros(1, dtype=np.int64)  # the control: a listening TCPStore on rank 0
    if r == 0:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    comm.Bcast(port, root=0)
    before = listening()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{int(port[0])}", rank=r,
                            world_size=n, timeout=timedelta(seconds=TIMEOUT_S))
    opened = listening() - before
    say("CONTROL", rank=r, opened=sorted(str(o) for o in opened),
        wildcard=any(o.wildcard for o in opened))
    dist.destroy_process_group()

    finish(comm, folder, plane.is_root)
    say("DONE", rank=r, folder=folder.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
