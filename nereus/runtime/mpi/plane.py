"""The MPI control plane: versioned plain-data messages between rank 0 and the workers.

Rank 0 (the controller) broadcasts plans, transition DAGs and step commands; measurements are
gathered back. Every message is a :class:`Message` of plain data (dicts, lists, numbers,
strings) that travels framed (:mod:`nereus.runtime.mpi.frames`: JSON and raw array bytes over
buffer-based MPI calls, length, version and checksum checked, the digest agreed by every rank
before anyone acts on it): nothing received is unpickled. A failure on one rank is reported
on every rank: :meth:`ControlPlane.agree` all-gathers each rank's outcome and raises the same
:class:`~nereus.errors.CommunicationError` everywhere when any rank failed (no rank waits alone).

The communicator is passed in (``mpi4py.MPI.Comm``); nothing here is a module global.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nereus.errors import CommunicationError
from nereus.runtime.mpi.frames import allgather, bcast

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

    def broadcast(self, msg: Message | None, kind: str) -> Message:
        """Root sends ``msg``, a ``kind`` message; every rank returns it. Non-root ranks pass
        None (and the kind they expect)."""
        if self.is_root:
            if msg is None:
                raise ValueError("root must provide the message")
            if msg.kind != kind:
                raise ValueError(f"root sends a {msg.kind} message as {kind}")
            self._seq = msg.seq
            wire = msg.to_wire()
        else:
            wire = None
        got = Message.from_wire(bcast(self.comm, wire, self.root, kind))
        if got.kind != kind:
            raise CommunicationError(f"control plane: expected a {kind} message, got {got.kind}")
        if not self.is_root:
            if got.seq < self._seq:
                raise CommunicationError(f"control plane: message {got.seq} after {self._seq}")
            self._seq = got.seq
        return got

    def next_seq(self) -> int:
        return self._seq + 1

    def gather(self, payload: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Every rank contributes ``payload``; the root gets the list in rank order."""
        out = allgather(self.comm, payload, "measure")  # small: every rank checks every part
        return out if self.is_root else None

    def agree(self, ok: bool, error: str = "") -> None:
        """Collective outcome check: raises on every rank if any rank failed."""
        outcomes = [RankOutcome(int(o[0]), bool(o[1]), str(o[2]))
                    for o in allgather(self.comm, [self.global_rank, ok, error], "agree")]
        failed = [o for o in outcomes if not o.ok]
        if failed:
            first = failed[0]
            more = f" (and {len(failed) - 1} more ranks)" if len(failed) > 1 else ""
            raise CommunicationError(f"rank {first.global_rank} failed: {first.error}{more}")
