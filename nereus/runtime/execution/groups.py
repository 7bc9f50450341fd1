"""Process groups of EMUs and of transitions, always passed explicitly (effectful).

Two kinds:
- *unit groups* (tp, pp, …) for a Megatron model: registered torch.distributed groups, created
  with ``dist.new_group``, which is collective over the whole default group — every rank of the
  job calls :func:`unit_groups` for every new unit, in the same order (the plan is deterministic,
  so every rank knows it).
- *transition groups* (:func:`transfer_group`, which every rank of the job calls for every
  transfer, in the order of the DAG's waves and the weight syncs): on the ``host`` transport a
  fresh ``ProcessGroupGloo`` over a ``PrefixStore`` unique to the transition, joined only by the
  GPUs that take part (:func:`transition_group`), with a bounded timeout, dropped after the
  transition (device tensors staged through pinned host buffers:
  :mod:`nereus.runtime.execution.wire`); on the ``device`` transport the members' NCCL (RCCL)
  communicator from the rank's cache (:class:`nereus.runtime.execution.device.RankDevice`),
  created collectively — every rank, members or not, takes part in its creation, so all agree
  on its name (a group created by its members alone waits forever: see ``RankDevice``).
The backend of a unit group is its members' transport (``nccl`` or ``gloo``), the same on every
rank because every rank holds every rank's placement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from nereus.cluster.transport import DEVICE, HOST
from nereus.emu.unit import Emu
from nereus.engines.megatron_model import StageGroups
from nereus.errors import CommunicationError, TransitionError

if TYPE_CHECKING:
    from nereus.runtime.execution.device import RankDevice


def unit_groups(emu: Emu, global_rank: int, timeout_s: float,
                device: RankDevice | None = None) -> StageGroups | None:
    """Create every group of ``emu`` (collective: all ranks call it); this rank's, or None.
    Each group's backend is its members' transport (gloo without ``device``)."""
    tp, pp = emu.layout.tp, emu.layout.pp
    to = timedelta(seconds=timeout_s)
    mine: dict[str, dist.ProcessGroup] = {}

    def make(name: str, ranks: list[int]) -> None:
        backend = "gloo" if device is None else device.backend(ranks)
        g = dist.new_group(sorted(ranks), timeout=to, backend=backend)
        if global_rank in ranks:
            mine[name] = g

    for p in range(pp):
        make("tp", [emu.gpu_at(p, t) for t in range(tp)])
    for t in range(tp):
        make("pp", [emu.gpu_at(p, t) for p in range(pp)])
        make("embd", sorted({emu.gpu_at(0, t), emu.gpu_at(pp - 1, t)}))
        make("pos_embd", [emu.gpu_at(0, t)])
    for g in emu.gpus:
        make("solo", [g])
    if global_rank not in emu.gpus:
        return None
    # Middle stages are in no embedding group; Megatron only uses those groups on member stages.
    return StageGroups(mine["tp"], mine["pp"], mine["solo"], mine.get("embd", mine["solo"]),
                       mine.get("pos_embd", mine["solo"]))


@dataclass
class TransitionGroup:
    """A group for one transition: ``members`` are global ranks (GPU ids), sorted.

    ``transport``: ``host`` — ``pg`` is a ProcessGroupGloo (a c10d Backend: send/recv/wait;
    untyped in torch stubs), ``staged`` when device tensors go through host buffers; ``device``
    — ``pg`` is a registered NCCL (RCCL) group on ``device``; ``label`` names it in the log."""

    pg: Any
    members: tuple[int, ...]
    timeout_s: float
    transport: str = HOST
    staged: bool = False
    device: torch.device | None = None
    label: str = "host:gloo"
    owner: Any = None  # the RankDevice whose cache holds ``pg`` (device transport)

    def group_rank(self, global_rank: int) -> int:
        return self.members.index(global_rank)

    def abort(self) -> None:
        """A transfer failed: abort the communicator so no member keeps waiting on it (a cached
        device communicator: every one of the rank's, and the cache is emptied)."""
        if self.owner is not None:
            self.owner.abort()
            return
        with contextlib.suppress(Exception):
            self.pg.abort()


def transfer_group(store: dist.Store, name: str, members: Sequence[int], global_rank: int,
                   timeout_s: float, device: RankDevice | None = None) -> TransitionGroup | None:
    """The group ``name`` (unique per transition) of ``members`` on a member, None elsewhere.

    Every rank of the job calls it for every transfer group, in the same order: with
    ``device``, members that can use the device transport share its cached communicator, whose
    creation is collective (:meth:`RankDevice.device_group`); a host group is joined by its
    members only (:func:`transition_group`)."""
    ms = tuple(sorted(set(members)))
    if device is not None and device.transport(ms) == DEVICE:
        try:
            pg = device.device_group(ms, timeout_s)
        except (RuntimeError, dist.DistError) as e:
            first = str(e).splitlines()[0] if str(e) else repr(e)
            raise CommunicationError(f"rank {global_rank}: creating the device communicator of "
                                     f"{ms} failed: {first}") from e
        if pg is None:
            return None
        return TransitionGroup(pg, ms, timeout_s, DEVICE, False, device.device,
                               device.label(ms), device)
    if global_rank not in ms:
        return None
    return transition_group(store, name, ms, global_rank, timeout_s, device)


def transition_group(store: dist.Store, name: str, members: tuple[int, ...], global_rank: int,
                     timeout_s: float, device: RankDevice | None = None) -> TransitionGroup:
    """Join the host group ``name`` (unique per transition) of ``members`` — called by the
    members only; blocks until all join. With ``device``: staged when it carries device
    tensors, labelled by its members' transport."""
    members = tuple(sorted(members))
    if device is not None and device.transport(members) == DEVICE:
        raise TransitionError(f"the device communicator of {members} is created by every rank: "
                              "transfer_group, not transition_group")
    prefix = dist.PrefixStore(f"nereus/transition/{name}", store)
    try:
        pg = dist.ProcessGroupGloo(prefix, members.index(global_rank), len(members),
                                   timedelta(seconds=timeout_s))
    except (RuntimeError, dist.DistError) as e:
        first = str(e).splitlines()[0] if str(e) else repr(e)
        raise CommunicationError(
            f"rank {global_rank}: joining transition group {name} of {members} failed: {first}"
        ) from e
    if device is None:
        return TransitionGroup(pg, members, timeout_s)
    return TransitionGroup(pg, members, timeout_s, HOST, device.staged(members), device.device,
                           device.label(members))
