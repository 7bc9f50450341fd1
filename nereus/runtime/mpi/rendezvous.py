"""torch.distributed rendezvous over the MPI control plane.

Rank 0 picks a free TCP port on its host and broadcasts ``(address, port, generation)``; every
rank then joins ``init_process_group(init_method="tcp://address:port")``. A new generation (after
a replan that changes the set of ranks, or after a failure) rendezvous again on a fresh port.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from nereus.errors import CommunicationError
from nereus.runtime.mpi.plane import ControlPlane, Message


@dataclass(frozen=True)
class RendezvousInfo:
    address: str
    port: int
    generation: int
    world_size: int


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def root_address() -> str:
    """An address of this host that the other ranks can reach (loopback on one host)."""
    host = socket.gethostname()
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        return "127.0.0.1"
    return addr


def rendezvous(
    plane: ControlPlane,
    generation: int,
    backend: str = "gloo",
    timeout_s: float = 60.0,
    address: str | None = None,
) -> RendezvousInfo:
    """Create the default torch.distributed group of all ranks of ``plane`` (collective)."""
    import torch.distributed as dist

    msg = None
    if plane.is_root:
        addr = address or root_address()
        msg = Message(
            "rendezvous",
            plane.next_seq(),
            {"address": addr, "port": free_port(addr), "generation": generation},
        )
    got = plane.broadcast(msg, "rendezvous")
    info = RendezvousInfo(
        str(got.payload["address"]), int(got.payload["port"]), int(got.payload["generation"]),
        plane.world_size,
    )
    error = ""
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{info.address}:{info.port}",
            rank=plane.global_rank,
            world_size=plane.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    except Exception as exc:  # reported on every rank below
        error = f"{type(exc).__name__}: {exc}"
    plane.agree(not error, error)
    return info


def teardown(group: Any = None) -> None:
    """Destroy ``group`` (or the default group) if it exists."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    try:
        dist.destroy_process_group(group)
    except Exception as exc:
        raise CommunicationError(f"destroying process group: {exc}") from None
