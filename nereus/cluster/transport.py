"""How two ranks exchange tensors, chosen from where they run (pure; DESIGN.md §4 *Transports*).

One executor, one weight sync, one DAG for every kind of hardware; only the transport of a set
of ranks differs:

- ``device`` — NCCL between NVIDIA GPUs, RCCL between AMD GPUs (torch's ``nccl`` backend on
  either build): every member on its own GPU of one vendor;
- ``host`` — gloo over TCP, device tensors staged through pinned host buffers: CPU ranks, ranks
  of different vendors (NCCL and RCCL cannot talk to each other) and ranks sharing one GPU
  (NCCL refuses two ranks of one communicator on one device).

Every rank holds the same :class:`RankPlacement` of every rank (gathered once at start), so every
rank computes the same choice for the same members — unit groups, which every rank creates in
the same order, get the same backend everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nereus.cluster.devices import CPU, DeviceChoice

DEVICE, HOST = "device", "host"
TRANSPORTS = (DEVICE, HOST)
GLOO, NCCL = "gloo", "nccl"


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank computes: its node (host name), device kind, vendor and physical device."""

    rank: int
    node: str
    kind: str  # cpu | cuda
    vendor: str  # cpu | nvidia | amd
    device_id: str  # node-local physical device ("" on the CPU)

    @staticmethod
    def of(rank: int, node: str, choice: DeviceChoice) -> RankPlacement:
        return RankPlacement(rank, node, choice.kind, choice.vendor, choice.device_id)

    def to_dict(self) -> dict[str, object]:
        return {"rank": self.rank, "node": self.node, "kind": self.kind, "vendor": self.vendor,
                "device_id": self.device_id}

    @staticmethod
    def from_dict(d: dict[str, object]) -> RankPlacement:
        return RankPlacement(int(str(d["rank"])), str(d["node"]), str(d["kind"]),
                             str(d["vendor"]), str(d["device_id"]))


def cpu_placements(world_size: int, node: str = "localhost") -> tuple[RankPlacement, ...]:
    """Every rank a CPU rank (the embedded default)."""
    return tuple(RankPlacement(r, node, CPU, CPU, "") for r in range(world_size))


def pair_transport(a: RankPlacement, b: RankPlacement) -> str:
    """The transport between two ranks (a rank with itself: ``device`` on a GPU)."""
    if a.kind == CPU or b.kind == CPU:
        return HOST
    if a.vendor != b.vendor:
        return HOST
    if a.rank != b.rank and a.node == b.node and a.device_id == b.device_id:
        return HOST
    return DEVICE


def group_transport(members: Iterable[int], placements: Sequence[RankPlacement]) -> str:
    """``device`` when every pair of ``members`` (global ranks) can use it, else ``host``."""
    ms = sorted(set(members))
    if not ms:
        return HOST
    if len(ms) == 1:
        return pair_transport(placements[ms[0]], placements[ms[0]])
    for i, a in enumerate(ms):
        for b in ms[i + 1:]:
            if pair_transport(placements[a], placements[b]) == HOST:
                return HOST
    return DEVICE


def backend_of(transport: str) -> str:
    """torch.distributed's backend name for a transport (``nccl`` is RCCL on ROCm builds)."""
    return NCCL if transport == DEVICE else GLOO


def default_backend(placements: Sequence[RankPlacement]) -> str:
    """The default group's backend: gloo for host tensors always, and NCCL/RCCL for device
    tensors when every rank can join one device communicator (none shares a GPU, one vendor)."""
    if group_transport(range(len(placements)), placements) == DEVICE:
        return f"cpu:{GLOO},cuda:{NCCL}"
    return GLOO


def staged(members: Iterable[int], placements: Sequence[RankPlacement]) -> bool:
    """Whether a host-transport group of ``members`` carries device tensors (staged through
    pinned host buffers): some member computes on a GPU."""
    return group_transport(members, placements) == HOST and any(
        placements[m].kind != CPU for m in members)


CROSS_VENDOR = "+cross-vendor"  # the suffix of a group whose members are of several vendors


def label(transport: str, placements: Sequence[RankPlacement], members: Iterable[int]) -> str:
    """How the log names a group's transport: ``device:nccl``, ``device:rccl``, ``host:gloo``
    or ``host:gloo-staged``; ``+cross-vendor`` appended when the members are of several vendors
    (CPU ranks playing vendors included), so the log shows which transport every crossing
    took."""
    ms = sorted(set(members))
    if transport == DEVICE:
        vendor = placements[ms[0]].vendor if ms else ""
        name = "device:rccl" if vendor == "amd" else "device:nccl"
    else:
        name = "host:gloo-staged" if staged(ms, placements) else "host:gloo"
    return name + CROSS_VENDOR if len({placements[m].vendor for m in ms}) > 1 else name


def summed(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Transfer groups by transport label, added over the ranks' counts."""
    out: dict[str, int] = {}
    for got in counts:
        for name, n in got.items():
            out[name] = out.get(name, 0) + int(n)
    return out
