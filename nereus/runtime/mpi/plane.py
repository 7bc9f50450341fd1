"""The MPI control plane: versioned plain-data messages between rank 0 and the workers.

Rank 0 (the controller) broadcasts plans, transition DAGs and step commands; measurements are
gathered back. Every message is a :class:`Message` of plain Python data (dicts, lists, numbers,
strings) so that it pickles small and any rank can decode it. A failure on one rank is reported
on every rank: :meth:`ControlPlane.agree` all-gathers each rank's outcome and raises the same
:class:`~nereus.errors.CommunicationError` everywhere when any rank failed (no rank waits alone).

The communicator is passed in (``mpi4py.MPI.Comm``); nothing here is a module global.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nereus.errors import CommunicationError

PROTOCOL_VERSION = 1
KINDS = ("plan", "dag", "step", "stop", "measure", "rendezvous", "state")


@dataclass(frozen=True)
class Message:
    kind: str
    seq: int
    payload: dict[str, Any] = field(default_factory=dict)
    version: int = PROTOCOL_VERSION

    def to_wire(self) -> dict[str, Any]:
        return {"v": self.version, "kind": self.kind, "seq": self.seq, "payload": self.payload}

    @staticmethod
    def from_wire(d: Any) -> Message:
        if not isinstance(d, dict) or "v" not in d:
            raise CommunicationError(f"control plane: not a Nereus message: {type(d).__name__}")
        if d["v"] != PROTOCOL_VERSION:
            raise CommunicationError(
                f"control plane: protocol version {d['v']} != {PROTOCOL_VERSION} (mixed installs?)"
            )
        if d["kind"] not in KINDS:
            raise CommunicationError(f"control plane: unknown message kind {d['kind']!r}")
        return Message(str(d["kind"]), int(d["seq"]), dict(d["payload"]), int(d["v"]))


@dataclass(frozen=True)
class RankOutcome:
    global_rank: int
    ok: bool
    error: str = ""


class ControlPlane:
    """Rank-0-rooted messaging over one MPI communicator."""

    def __init__(self, comm: Any, root: int = 0) -> None:
        self.comm = comm
        self.root = root
        self.global_rank: int = comm.Get_rank()
        self.world_size: int = comm.Get_size()
        self._seq = 0

    @property
    def is_root(self) -> bool:
        return self.global_rank == self.root

    def broadcast(self, msg: Message | None) -> Message:
        """Root sends ``msg``; every rank returns it. Non-root ranks pass None."""
        if self.is_root:
            if msg is None:
                raise ValueError("root must provide the message")
            self._seq = msg.seq
            wire = msg.to_wire()
        else:
            wire = None
        got = Message.from_wire(self.comm.bcast(wire, root=self.root))
        if not self.is_root:
            if got.seq < self._seq:
                raise CommunicationError(f"control plane: message {got.seq} after {self._seq}")
            self._seq = got.seq
        return got

    def next_seq(self) -> int:
        return self._seq + 1

    def gather(self, payload: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Every rank contributes ``payload``; the root gets the list in rank order."""
        out = self.comm.gather(payload, root=self.root)
        return list(out) if out is not None else None

    def agree(self, ok: bool, error: str = "") -> None:
        """Collective outcome check: raises on every rank if any rank failed."""
        outcomes = [RankOutcome(*o) for o in self.comm.allgather((self.global_rank, ok, error))]
        failed = [o for o in outcomes if not o.ok]
        if failed:
            first = failed[0]
            more = f" (and {len(failed) - 1} more ranks)" if len(failed) > 1 else ""
            raise CommunicationError(f"rank {first.global_rank} failed: {first.error}{more}")
