"""Execute Split / Merge / Extend / Destroy and the actor weight sync over torch.distributed.

Every rank of the job runs the same sequence of (pure, deterministic) primitive records. A rank
taking part in a transfer joins a gloo group created for that transition only (unique store
prefix, bounded timeout) and drops it afterwards; the unit groups of new units are created by
every rank (``dist.new_group`` is collective). Transfers are point-to-point: per peer pair one
contiguous buffer (all moves between the pair, all fields), all pairs posted at once:
- Split: the position-wise all-gather: inside each block of GPUs sharing a new position every
  GPU receives the other members' shards it lacks (an all-gather-v as pairwise exchanges);
- Merge: every merged shard is already resident; local copies only, nothing is sent;
- Extend: rank-aligned pairwise transfers from the replicas to the new GPUs;
- Destroy: drop the model and optimizer (only a redundant copy; TransitionError otherwise).
Sources are freed only after every transfer of the primitive has completed; a failed or timed
out transfer raises CommunicationError and leaves the source units intact.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from nereus.emu.boxes import Box
from nereus.emu.primitives import Destroy, Extend, Merge, Split, destroy
from nereus.emu.transfer import Move, TransferPlan, combine_plans
from nereus.emu.unit import Emu
from nereus.errors import CommunicationError, TransitionError
from nereus.runtime.groups import TransitionGroup, transition_group, unit_groups
from nereus.runtime.pack import pack, unpack
from nereus.runtime.state import FIELDS, Counters, UnitState, new_unit_state
from nereus.spec.model import ModelSpec

Units = dict[Emu, UnitState]  # the units this rank takes part in


def _view(t: torch.Tensor, box: Box) -> torch.Tensor:
    return t[tuple(slice(a, b) for a, b in zip(box.start, box.stop, strict=True))]


META_VALUES = 5  # updates, model-stage version, policy version, position p, Adam step


def meta_of(s: UnitState) -> torch.Tensor:
    c = s.counters
    return torch.tensor([c.updates, c.model_stage_version, c.policy_version, c.position,
                         round(s.step_value())], dtype=torch.int64)


def execute_plan(plan: TransferPlan, global_rank: int, sources: Sequence[UnitState | None],
                 targets: Sequence[UnitState | None], group: TransitionGroup | None
                 ) -> torch.Tensor | None:
    """Run ``plan`` on this rank: ``sources[i]`` / ``targets[j]`` are this rank's states of
    plan.sources[i] / plan.targets[j] (None where the rank holds no part).

    Besides the shards, a target GPU holding no source receives the counters and Adam step
    (:data:`META_VALUES` int64) from its lowest-id sender; returned as a tensor (else None)."""
    src_gpus = {g for e in plan.sources for g in e.gpus}
    my_src = next((s for s in sources if s is not None), None)
    fields = FIELDS[:plan.fields]
    src_t = [s.tensors() if s is not None else None for s in sources]
    dst_t = [t.tensors() if t is not None else None for t in targets]

    def src_view(m: Move, f: str) -> torch.Tensor:
        held = src_t[m.src_unit]
        assert held is not None
        return _view(held[f][m.src_key], m.src_box)

    def dst_view(m: Move, f: str) -> torch.Tensor:
        held = dst_t[m.dst_unit]
        assert held is not None
        return _view(held[f][m.dst_key], m.dst_box)

    send_to, recv_from = plan.peers(global_rank)
    meta: torch.Tensor | None = None
    works: list[tuple[str, int, dist.Work]] = []
    recv_bufs: dict[int, torch.Tensor] = {}
    if send_to or recv_from:
        if group is None:
            raise TransitionError(f"rank {global_rank} must transfer but has no transition group")
        current = "posting transfers"
        try:
            for peer in send_to:
                buf = pack([src_view(m, f) for m in plan.sends(global_rank, peer) for f in fields])
                works.append(("send to", peer, group.pg.send([buf], group.group_rank(peer), 0)))
                if peer not in src_gpus and min(plan.peers(peer)[1]) == global_rank:
                    assert my_src is not None
                    works.append(("send meta to", peer,
                                  group.pg.send([meta_of(my_src)], group.group_rank(peer), 1)))
            for peer in recv_from:
                n = sum(m.values for m in plan.sends(peer, global_rank)) * len(fields)
                recv_bufs[peer] = torch.empty(n, dtype=torch.float32)
                works.append(("recv from", peer,
                              group.pg.recv([recv_bufs[peer]], group.group_rank(peer), 0)))
            if recv_from and global_rank not in src_gpus:
                meta = torch.empty(META_VALUES, dtype=torch.int64)
                works.append(("recv meta from", recv_from[0],
                              group.pg.recv([meta], group.group_rank(recv_from[0]), 1)))
            for doing, peer, w in works:
                current = f"{doing} rank {peer}"
                w.wait(timedelta(seconds=group.timeout_s))
        except (RuntimeError, dist.DistError) as e:
            first = str(e).splitlines()[0] if str(e) else repr(e)
            raise CommunicationError(
                f"rank {global_rank}: {current} failed (timeout {group.timeout_s:g} s): {first}"
            ) from e
    with torch.no_grad():
        for m in plan.sends(global_rank, global_rank):
            for f in fields:
                dst_view(m, f).copy_(src_view(m, f))
        for peer, buf in recv_bufs.items():
            unpack(buf, [dst_view(m, f) for m in plan.sends(peer, global_rank) for f in fields])
    return meta


class Executor:
    """Runs primitive records on one rank; ``units`` is what this rank holds."""

    def __init__(self, spec: ModelSpec, global_rank: int, store: dist.Store, namespace: str, *,
                 timeout_s: float = 30.0, lr: float = 1e-3) -> None:
        """``namespace`` names this run of transitions (the same on every rank, new per run)."""
        self.namespace = namespace
        self.spec = spec
        self.global_rank = global_rank
        self.store = store
        self.timeout_s = timeout_s
        self.lr = lr
        self.units: Units = {}
        self._seq = 0
        self.last_transfer_s = 0.0  # wall time of the last plan execution on this rank

    def create(self, emu: Emu, counters: Counters | None = None, step: float = 0.0,
               initialize: bool = True) -> None:
        """Create the groups (collective) and, on its ranks, the state of a new unit."""
        groups = unit_groups(emu, self.global_rank, self.timeout_s)
        if groups is not None:
            self.units[emu] = new_unit_state(self.spec, emu, self.global_rank, groups, lr=self.lr,
                                             step=step, counters=counters, initialize=initialize)

    def _group(self, plan: TransferPlan) -> TransitionGroup | None:
        self._seq += 1
        members = tuple(sorted({m.src_gpu for m in plan.moves if not m.is_local}
                               | {m.dst_gpu for m in plan.moves if not m.is_local}))
        if self.global_rank not in members:
            return None
        return transition_group(self.store, f"{self.namespace}/{self._seq}", members,
                                self.global_rank, self.timeout_s)

    def _transfer(self, plan: TransferPlan) -> list[UnitState | None]:
        """Create the target units, fill them from the sources; sources untouched."""
        ref = next((self.units[e] for e in plan.sources if e in self.units), None)
        counters, step = None, 0.0
        if ref is not None:
            counters = Counters(**vars(ref.counters))
            step = ref.step_value()
        pending: list[UnitState | None] = []
        for emu in plan.targets:
            groups = unit_groups(emu, self.global_rank, self.timeout_s)
            pending.append(None if groups is None else new_unit_state(
                self.spec, emu, self.global_rank, groups, lr=self.lr, step=step,
                counters=counters, initialize=False))
        group = self._group(plan)
        t0 = time.perf_counter()
        meta = execute_plan(plan, self.global_rank, [self.units.get(e) for e in plan.sources],
                            pending, group)
        if meta is not None:
            c = Counters(*(int(v) for v in meta[:4]))
            for st in pending:
                if st is not None:
                    st.counters = c
                    for opt_state in st.optimizer.state.values():
                        opt_state["step"].fill_(float(meta[4]))
        self.last_transfer_s = time.perf_counter() - t0
        return pending

    def _install(self, plan: TransferPlan, made: list[UnitState | None],
                 drop: Sequence[Emu]) -> None:
        for emu in drop:
            self.units.pop(emu, None)
        for emu, st in zip(plan.targets, made, strict=True):
            if st is not None:
                self.units[emu] = st

    def split(self, op: Split) -> None:
        made = self._transfer(op.plan)
        self._install(op.plan, made, [op.source])

    def merge(self, op: Merge) -> None:
        made = self._transfer(op.plan)
        self._install(op.plan, made, list(op.sources))

    def extend(self, op: Extend) -> None:
        made = self._transfer(op.plan)
        self._install(op.plan, made, [])

    def concurrent(self, ops: Sequence[Split | Merge | Extend]) -> None:
        """Run several transfer primitives as one pass (all their pairs at once)."""
        plan = combine_plans([op.plan for op in ops])
        made = self._transfer(plan)
        drop: list[Emu] = []
        for op in ops:
            if isinstance(op, Split):
                drop.append(op.source)
            elif isinstance(op, Merge):
                drop += op.sources
        self._install(plan, made, drop)

    def destroy(self, op: Destroy) -> None:
        destroy(op.unit, op.survivors)  # re-checks: never the last copy
        self.units.pop(op.unit, None)

    def weight_sync(self, plan: TransferPlan) -> None:
        """Copy parameters from the train units into the existing gen units (fields=1)."""
        if plan.fields != 1:
            raise TransitionError("weight sync moves parameters only (fields=1)")
        group = self._group(plan)
        t0 = time.perf_counter()
        execute_plan(plan, self.global_rank, [self.units.get(e) for e in plan.sources],
                     [self.units.get(e) for e in plan.targets], group)
        self.last_transfer_s = time.perf_counter() - t0
