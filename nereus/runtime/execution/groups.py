"""Process groups of EMUs and of transitions, always passed explicitly (effectful).

Two kinds:
- *unit groups* (tp, pp, …) for a Megatron model: registered torch.distributed groups, created
  with ``dist.new_group``, which is collective over the whole default group — every rank of the
  job calls :func:`unit_groups` for every new unit, in the same order (the plan is deterministic,
  so every rank knows it).
- *transition groups*: a fresh ``ProcessGroupGloo`` over a ``PrefixStore`` unique to the
  transition, joined only by the GPUs that take part, with a bounded timeout, dropped after the
  transition. On CUDA/ROCm the same code would build ``ProcessGroupNCCL`` (RCCL on ROCm).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from nereus.emu.unit import Emu
from nereus.engines.megatron_model import StageGroups
from nereus.errors import CommunicationError


def unit_groups(emu: Emu, global_rank: int, timeout_s: float) -> StageGroups | None:
    """Create every group of ``emu`` (collective: all ranks call it); this rank's, or None."""
    tp, pp = emu.layout.tp, emu.layout.pp
    to = timedelta(seconds=timeout_s)
    mine: dict[str, dist.ProcessGroup] = {}

    def make(name: str, ranks: list[int]) -> None:
        g = dist.new_group(sorted(ranks), timeout=to, backend="gloo")
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
    """A gloo group for one transition: ``members`` are global ranks (GPU ids), sorted."""

    pg: Any  # ProcessGroupGloo (a c10d Backend: send/recv/wait; untyped in torch stubs)
    members: tuple[int, ...]
    timeout_s: float

    def group_rank(self, global_rank: int) -> int:
        return self.members.index(global_rank)


def transition_group(store: dist.Store, name: str, members: tuple[int, ...], global_rank: int,
                     timeout_s: float) -> TransitionGroup:
    """Join the group ``name`` (unique per transition) of ``members``; blocks until all join."""
    members = tuple(sorted(members))
    prefix = dist.PrefixStore(f"nereus/transition/{name}", store)
    try:
        pg = dist.ProcessGroupGloo(prefix, members.index(global_rank), len(members),
                                   timedelta(seconds=timeout_s))
    except (RuntimeError, dist.DistError) as e:
        first = str(e).splitlines()[0] if str(e) else repr(e)
        raise CommunicationError(
            f"rank {global_rank}: joining transition group {name} of {members} failed: {first}"
        ) from e
    return TransitionGroup(pg, members, timeout_s)
