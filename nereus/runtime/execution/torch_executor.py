"""The torch executor: Split / Merge / Extend / Destroy and the weight sync on real tensors.

Every rank of the job runs the same sequence of primitive records — the transition DAG's own
nodes (:mod:`nereus.emu.primitives`) — and computes each one's exact per-tensor transfer plan
from the node and the model's shard rules (:func:`nereus.emu.transfer.node_transfer`). A rank
taking part in a transfer joins the transition's group — on the host transport a gloo group
created for that transition only (unique store prefix, bounded timeout) and dropped afterwards,
device tensors staged through pinned host buffers; on the device transport the members' cached
NCCL (RCCL) communicator (:mod:`nereus.runtime.execution.groups`,
:mod:`nereus.runtime.execution.wire`). Group creation follows the primitives' order on every
rank: the unit groups of new units and the device communicators are created by every rank
(``dist.new_group`` is collective), members or not. Transfers are point-to-point, all pairs
posted at once; per pair, contiguous source slices go as they are (no copy) straight into
contiguous destination slices, the rest packed into one buffer by the process's packer — the
compiled kernels on GPUs, torch elsewhere (:mod:`nereus.runtime.execution.packer`):
- Split: the position-wise all-gather: inside each block of GPUs sharing a new position every
  GPU receives the other members' shards it lacks; as pairwise sends (default) or, with
  ``TorchExecutor.split_allgather``, one gloo all-gather per block on a group of the block's GPUs;
- Merge: every merged shard is already resident; local copies only, nothing is sent;
- Extend: rank-aligned pairwise transfers from the replicas to the new GPUs;
- Destroy: drop the model and optimizer (only a redundant copy; TransitionError otherwise).
Local copies run while the transfers are in flight. Sources are freed only after every transfer
of the primitive has completed; a failed or timed out transfer raises CommunicationError and
leaves the source units intact.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from nereus.cluster.transport import DEVICE
from nereus.emu.boxes import Box
from nereus.emu.primitives import Destroy, Extend, Merge, Split, TransferNode, check_destroy
from nereus.emu.shards import shards_at
from nereus.emu.transfer import Move, TransferPlan, combine_plans, node_transfer
from nereus.emu.unit import Emu
from nereus.errors import CommunicationError, TransitionError
from nereus.runtime.execution.device import RankDevice
from nereus.runtime.execution.groups import TransitionGroup, transfer_group, unit_groups
from nereus.runtime.execution.pack import PairMessages, box_is_contiguous, pair_messages
from nereus.runtime.execution.packer import TORCH_PACKER, Packer, process_packer
from nereus.runtime.execution.wire import Posted, Wire, post_all_gather
from nereus.runtime.worker.state import FIELDS, Counters, UnitState, new_unit_state
from nereus.spec.model import ModelSpec

Units = dict[Emu, UnitState]  # the units this rank takes part in


def _view(t: torch.Tensor, box: Box) -> torch.Tensor:
    return t[tuple(slice(a, b) for a, b in zip(box.start, box.stop, strict=True))]


META_VALUES = 5  # updates, model-stage version, policy version, position p, Adam step
PACKED_TAG, META_TAG, DIRECT_TAG0 = 0, 1, 2  # message tags of a pair; direct item k: 2 + k


def meta_of(s: UnitState) -> torch.Tensor:
    c = s.counters
    return torch.tensor([c.updates, c.model_stage_version, c.policy_version, c.position,
                         round(s.step_value())], dtype=torch.int64)


@functools.lru_cache(maxsize=4096)
def _local_shapes(spec: ModelSpec, emu: Emu, gpu: int) -> dict[str, tuple[int, ...]]:
    pp_rank, tp_rank = divmod(emu.gpus.index(gpu), emu.layout.tp)
    return {s.local_key: s.local_shape for s in shards_at(spec, emu.layout, pp_rank, tp_rank)}


def _pair(spec: ModelSpec, plan: TransferPlan, src_gpu: int, dst_gpu: int,
          nfields: int) -> tuple[list[tuple[Move, int]], PairMessages]:
    """The items (move, field index) from ``src_gpu`` to ``dst_gpu`` and their messages; both
    ends compute the same from the plan."""
    moves = plan.sends(src_gpu, dst_gpu)
    items = [(m, f) for m in moves for f in range(nfields)]
    contiguous = [box_is_contiguous(
        m.src_box, _local_shapes(spec, plan.sources[m.src_unit], src_gpu)[m.src_key])
        for m, _ in items]
    return items, pair_messages([m.values for m, _ in items], contiguous)


def block_contributions(plan: TransferPlan, block: Sequence[int]
                        ) -> tuple[tuple[Move, ...], ...] | None:
    """Per member of ``block``: the moves it sends to each other member, if the source slices
    are the same for every receiver (so one all-gather delivers them); else None."""
    out: list[tuple[Move, ...]] = []
    for i in block:
        others = [j for j in block if j != i]
        sent = [plan.sends(i, j) for j in others]
        keys = {tuple((m.src_unit, m.src_key, m.src_box) for m in s) for s in sent}
        if len(keys) != 1:
            return None
        out.append(sent[0])
    return tuple(out)


def _comm_error(global_rank: int, doing: str, timeout_s: float,
                e: BaseException) -> CommunicationError:
    first = str(e).splitlines()[0] if str(e) else repr(e)
    return CommunicationError(f"rank {global_rank}: {doing} failed (timeout {timeout_s:g} s): "
                              f"{first}")


def execute_plan(plan: TransferPlan, global_rank: int, sources: Sequence[UnitState | None],
                 targets: Sequence[UnitState | None], group: TransitionGroup | None,
                 gathers: Sequence[tuple[tuple[int, ...], TransitionGroup | None]] = (),
                 *, overlap_local: bool | None = None,
                 on_transfers_done: Callable[[], None] | None = None,
                 packer: Packer | None = None,
                 stats: dict[str, int] | None = None) -> torch.Tensor | None:
    """Run ``plan`` on this rank: ``sources[i]`` / ``targets[j]`` are this rank's states of
    plan.sources[i] / plan.targets[j] (None where the rank holds no part).

    Moves between members of a block in ``gathers`` (block, the block's group on its members)
    travel by one all-gather in that block (:func:`block_contributions` must hold); every other
    non-local move pairwise over ``group``. Besides the shards, a target GPU holding no source
    receives the counters and Adam step (:data:`META_VALUES` int64) from its lowest-id sender;
    returned as a tensor (else None).

    The moves inside this rank (``plan.sends(r, r)``) are copied while the transfers are in
    flight when ``overlap_local`` (default: the tensors are on a GPU, whose device memory copies
    run beside the network), else after the last transfer: on a CPU rank both are memcpy on the
    same cores, so overlapping gains nothing (live time equal within noise, RESULTS.md
    *resharding*) and only hides the transfers' own time. ``on_transfers_done`` is called when
    the last transfer (and its unpacking) has completed, before any deferred local copy."""
    src_gpus = {g for e in plan.sources for g in e.gpus}
    held = next((s for s in [*sources, *targets] if s is not None), None)
    if held is None:
        return None
    spec = held.spec
    my_src = next((s for s in sources if s is not None), None)
    fields = FIELDS[:plan.fields]
    src_t = [s.tensors() if s is not None else None for s in sources]
    dst_t = [t.tensors() if t is not None else None for t in targets]

    def src_view(m: Move, f: int) -> torch.Tensor:
        tensors = src_t[m.src_unit]
        assert tensors is not None
        return _view(tensors[fields[f]][m.src_key], m.src_box)

    def dst_view(m: Move, f: int) -> torch.Tensor:
        tensors = dst_t[m.dst_unit]
        assert tensors is not None
        return _view(tensors[fields[f]][m.dst_key], m.dst_box)

    block_of = {g: b for b, _ in gathers for g in b}

    def pairwise(a: int, b: int) -> bool:
        return a != b and not (a in block_of and block_of.get(b) == block_of[a])

    send_to = sorted({m.dst_gpu for m in plan.moves
                      if m.src_gpu == global_rank and pairwise(global_rank, m.dst_gpu)})
    recv_from = sorted({m.src_gpu for m in plan.moves
                        if m.dst_gpu == global_rank and pairwise(m.src_gpu, global_rank)})
    packer = packer if packer is not None else process_packer(
        next(held.model.parameters()).device.type)
    meta: torch.Tensor | None = None
    # (what, peer, work, copy after completion or None, timeout) in the order they are waited
    works: list[Posted] = []
    keep: list[torch.Tensor] = []  # buffers that must outlive their work
    current = "posting transfers"
    timeout_s = group.timeout_s if group is not None else 0.0
    try:
        if send_to or recv_from:
            if group is None:
                raise TransitionError(
                    f"rank {global_rank} must transfer but has no transition group")
            wire = Wire(group, global_rank)
            for peer in send_to:
                items, msgs = _pair(spec, plan, global_rank, peer, len(fields))
                for k, i in enumerate(msgs.direct):
                    view = src_view(*items[i])
                    assert view.is_contiguous()
                    wire.send(view, peer, DIRECT_TAG0 + k)
                if msgs.packed:
                    wire.send(packer.pack([src_view(*items[i]) for i in msgs.packed]), peer,
                              PACKED_TAG)
                peer_from = sorted({m.src_gpu for m in plan.moves
                                    if m.dst_gpu == peer and m.src_gpu != peer})
                if peer not in src_gpus and peer_from[0] == global_rank:
                    assert my_src is not None
                    wire.send(meta_of(my_src), peer, META_TAG, "send meta to")
            for peer in recv_from:
                items, msgs = _pair(spec, plan, peer, global_rank, len(fields))
                for k, i in enumerate(msgs.direct):
                    wire.recv(dst_view(*items[i]), peer, DIRECT_TAG0 + k)
                if msgs.packed:
                    views = [dst_view(*items[i]) for i in msgs.packed]
                    wire.recv_buffer(sum(v.numel() for v in views), views[0].dtype,
                                     views[0].device, peer, PACKED_TAG,
                                     functools.partial(_unpack_into, packer, views))
            if recv_from and global_rank not in src_gpus:
                meta = torch.empty(META_VALUES, dtype=torch.int64)
                wire.recv(meta, recv_from[0], META_TAG, "recv meta from")
            works += wire.post()
            keep += wire.keep
            if stats is not None:
                stats["staged_bytes"] = stats.get("staged_bytes", 0) + wire.staged_bytes
        for block, bgroup in gathers:
            if global_rank in block and bgroup is not None:
                current = f"all-gather in block {block}"
                works.append(_post_gather(plan, block, bgroup, global_rank, len(fields),
                                          src_view, dst_view, packer, keep))
    except (RuntimeError, dist.DistError) as e:
        _abort(group, gathers)
        raise _comm_error(global_rank, current, timeout_s, e) from e
    if overlap_local is None:
        overlap_local = next(held.model.parameters()).is_cuda

    def local_copies() -> None:
        for m in plan.sends(global_rank, global_rank):
            for f in range(len(fields)):
                dst_view(m, f).copy_(src_view(m, f))

    with torch.no_grad():
        if overlap_local:
            local_copies()  # overlaps the transfers in flight
        for doing, peer, w, post, wait_s in works:
            try:
                w.wait(timedelta(seconds=wait_s))
            except (RuntimeError, dist.DistError) as e:
                _abort(group, gathers)
                what = doing if peer < 0 else f"{doing} rank {peer}"
                raise _comm_error(global_rank, what, wait_s, e) from e
            if post is not None:
                post()
        if on_transfers_done is not None:
            on_transfers_done()
        if not overlap_local:
            local_copies()
    return meta


def _unpack_into(packer: Packer, views: list[torch.Tensor], buf: torch.Tensor) -> None:
    packer.unpack(buf, views)


def _abort(group: TransitionGroup | None,
           gathers: Sequence[tuple[tuple[int, ...], TransitionGroup | None]]) -> None:
    """A transfer failed: abort the device communicators involved (gloo groups time out on
    their own), so a member waiting on this rank raises instead of hanging."""
    for g in [group, *(bg for _, bg in gathers)]:
        if g is not None and g.transport == DEVICE:
            g.abort()


def _post_gather(plan: TransferPlan, block: tuple[int, ...], bgroup: TransitionGroup,
                 global_rank: int, nfields: int, src_view: Callable[[Move, int], torch.Tensor],
                 dst_view: Callable[[Move, int], torch.Tensor], packer: Packer,
                 keep: list[torch.Tensor]) -> Posted:
    """Post this member's all-gather of ``block`` (equal slots, zero-padded to the largest)."""
    contrib = block_contributions(plan, block)
    if contrib is None:
        raise TransitionError(f"block {block} is not one all-gather")
    sizes = [sum(m.values for m in c) * nfields for c in contrib]
    slot = max(sizes)
    me = block.index(global_rank)
    mine = packer.pack([src_view(m, f) for m in contrib[me] for f in range(nfields)],
                       length=slot)
    keep.append(mine)

    def scatter(out: torch.Tensor) -> None:
        for i, src_gpu in enumerate(block):
            if src_gpu != global_rank:
                moves = plan.sends(src_gpu, global_rank)
                packer.unpack(out[i * slot:i * slot + sizes[i]],
                              [dst_view(m, f) for m in moves for f in range(nfields)])

    return post_all_gather(bgroup, mine, slot * len(block), scatter,
                           f"all-gather in block {block}", keep)


class TorchExecutor:
    """Runs one model-stage's primitive records on one rank over torch.distributed; ``units`` is
    what this rank holds."""

    def __init__(self, spec: ModelSpec, global_rank: int, store: dist.Store, namespace: str, *,
                 fields: int = len(FIELDS), gpus_per_node: int = 8, timeout_s: float = 30.0,
                 lr: float = 1e-3, device: RankDevice | None = None) -> None:
        """``namespace`` names this run of transitions (the same on every rank, new per run);
        ``fields``: 3 for a trained model-stage (parameters, Adam's moments), 1 for weights
        only; ``device``: this rank's device, transports and packer (CPU ranks without it)."""
        self.device = device
        self.packer = device.packer if device is not None else None
        # transfer groups this executor joined, by transport label ("device:nccl", "host:gloo"…)
        self.transports: dict[str, int] = {}
        self.stats: dict[str, int] = {}  # staged_bytes: what went through host buffers
        self.namespace = namespace
        self.spec = spec
        self.fields = fields
        self.gpus_per_node = gpus_per_node
        self.global_rank = global_rank
        self.store = store
        self.timeout_s = timeout_s
        self.lr = lr
        self.units: Units = {}
        self._seq = 0
        self.last_transfer_s = 0.0  # wall time of the last plan execution on this rank
        # ... of it, until its last transfer had completed (local copies deferred on CPU ranks)
        self.last_network_s = 0.0
        # Split blocks as one gloo all-gather each instead of pairwise sends inside the block:
        # off, gloo's all-gather measured 2-4x slower than the pairwise sends (RESULTS.md)
        self.split_allgather = False
        # local copies beside the transfers (None: on a GPU only; see execute_plan)
        self.overlap_local: bool | None = None
        # transfers over the host transport whatever the ranks' devices (a reload from shards
        # parked in host memory: :mod:`nereus.runtime.execution.host_stage`)
        self.host_transport = False

    def create(self, emu: Emu, counters: Counters | None = None, step: float = 0.0,
               initialize: bool = True) -> None:
        """Create the groups (collective) and, on its ranks, the state of a new unit."""
        groups = unit_groups(emu, self.global_rank, self.timeout_s, self.device)
        if groups is not None:
            self.units[emu] = new_unit_state(self.spec, emu, self.global_rank, groups, lr=self.lr,
                                             step=step, counters=counters, initialize=initialize,
                                             device=self.device)

    def _group(self, plan: TransferPlan, blocks: Sequence[tuple[int, ...]] = ()
               ) -> TransitionGroup | None:
        """The pairwise group: the GPUs of the non-local moves not inside one of ``blocks``
        (every rank calls it, the same plans in the same order; None on a non-member)."""
        self._seq += 1
        block_of = {g: b for b in blocks for g in b}
        pairwise = [m for m in plan.moves if not m.is_local
                    and not (m.src_gpu in block_of and block_of.get(m.dst_gpu) == block_of[m.src_gpu])]
        members = tuple(sorted({m.src_gpu for m in pairwise} | {m.dst_gpu for m in pairwise}))
        if not members:
            return None
        # every rank: a device communicator's creation is collective (a host-staged transfer
        # runs on the host transport on every rank alike)
        group = transfer_group(self.store, f"{self.namespace}/{self._seq}", members,
                               self.global_rank, self.timeout_s,
                               None if self.host_transport else self.device)
        if group is not None:
            self.transports[group.label] = self.transports.get(group.label, 0) + 1
        return group

    def _gathers(self, plan: TransferPlan, blocks: Sequence[tuple[int, ...]]
                 ) -> list[tuple[tuple[int, ...], TransitionGroup | None]]:
        """The Split blocks that move data as one all-gather, each with its group (joined by
        the block's members; None elsewhere; every rank calls it). Call after :meth:`_group`."""
        if not self.split_allgather:
            return []
        out: list[tuple[tuple[int, ...], TransitionGroup | None]] = []
        for block in blocks:
            inner = [m for m in plan.moves if not m.is_local
                     and m.src_gpu in block and m.dst_gpu in block]
            if len(block) < 2 or not inner or block_contributions(plan, block) is None:
                continue
            group = transfer_group(self.store, f"{self.namespace}/{self._seq}/gather{block[0]}",
                                   block, self.global_rank, self.timeout_s, self.device)
            out.append((block, group))
        return out

    def _transfer(self, plan: TransferPlan, blocks: Sequence[tuple[int, ...]] = ()
                  ) -> list[UnitState | None]:
        """Create the target units, fill them from the sources; sources untouched."""
        ref = next((self.units[e] for e in plan.sources if e in self.units), None)
        counters, step = None, 0.0
        if ref is not None:
            counters = Counters(**vars(ref.counters))
            step = ref.step_value()
        pending: list[UnitState | None] = []
        for emu in plan.targets:
            groups = unit_groups(emu, self.global_rank, self.timeout_s, self.device)
            pending.append(None if groups is None else new_unit_state(
                self.spec, emu, self.global_rank, groups, lr=self.lr, step=step,
                counters=counters, initialize=False, device=self.device))
        gather_blocks = [b for b in blocks if self.split_allgather
                         and block_contributions(plan, b) is not None]
        group = self._group(plan, gather_blocks)
        gathers = self._gathers(plan, gather_blocks)
        meta = self._execute(plan, pending, group, gathers)
        if meta is not None:
            c = Counters(*(int(v) for v in meta[:4]))
            for st in pending:
                if st is not None:
                    st.counters = c
                    for opt_state in st.optimizer.state.values():
                        opt_state["step"].fill_(float(meta[4]))
        for st in pending:
            if st is not None:
                st.refresh_model()  # the parameters from the master weights just written
        return pending

    def _execute(self, plan: TransferPlan, targets: Sequence[UnitState | None],
                 group: TransitionGroup | None,
                 gathers: Sequence[tuple[tuple[int, ...], TransitionGroup | None]] = ()
                 ) -> torch.Tensor | None:
        """:func:`execute_plan` from this rank's units, timed (``last_transfer_s``,
        ``last_network_s``)."""
        t0 = time.perf_counter()
        self.last_network_s = 0.0

        def transfers_done() -> None:
            self.last_network_s = time.perf_counter() - t0

        meta = execute_plan(plan, self.global_rank, [self.units.get(e) for e in plan.sources],
                            targets, group, gathers, overlap_local=self.overlap_local,
                            on_transfers_done=transfers_done, packer=self.packer,
                            stats=self.stats)
        if self.device is not None:
            self.device.synchronize()  # device copies and unpacks are asynchronous
        self.last_transfer_s = time.perf_counter() - t0
        return meta

    def _install(self, plan: TransferPlan, made: list[UnitState | None],
                 drop: Sequence[Emu]) -> None:
        for emu in drop:
            self.units.pop(emu, None)
        for emu, st in zip(plan.targets, made, strict=True):
            if st is not None:
                self.units[emu] = st

    def plan_of(self, op: TransferNode) -> TransferPlan:
        """The exact transfer plan of ``op`` (the same on every rank: a pure function)."""
        return node_transfer(self.spec, op, gpus_per_node=self.gpus_per_node, fields=self.fields)

    def split(self, op: Split) -> TransferPlan:
        plan = self.plan_of(op)
        made = self._transfer(plan, op.blocks())
        self._install(plan, made, [op.src])
        return plan

    def merge(self, op: Merge) -> TransferPlan:
        plan = self.plan_of(op)
        made = self._transfer(plan)
        self._install(plan, made, list(op.srcs))
        return plan

    def extend(self, op: Extend) -> TransferPlan:
        plan = self.plan_of(op)
        made = self._transfer(plan)
        self._install(plan, made, [])
        return plan

    def concurrent(self, ops: Sequence[TransferNode]) -> list[TransferPlan]:
        """Run several transfer primitives as one pass (all their pairs at once); returns each
        one's plan, in order."""
        plans = [self.plan_of(op) for op in ops]
        plan = combine_plans(plans)
        made = self._transfer(plan, [b for op in ops if isinstance(op, Split)
                                     for b in op.blocks()])
        drop: list[Emu] = []
        for op in ops:
            if isinstance(op, Split):
                drop.append(op.src)
            elif isinstance(op, Merge):
                drop += op.srcs
        self._install(plan, made, drop)
        return plans

    def from_host(self, plan: TransferPlan, host: object | None) -> list[UnitState | None]:
        """Build ``plan.targets`` from its one source unit parked in host memory (``host``:
        this rank's part of it, a :class:`nereus.runtime.execution.host_stage.HostShard`, or
        None), over the host transport; returns this rank's new units (None where it holds
        none) and forgets the host part."""
        (source,) = plan.sources
        if host is not None:
            self.units[source] = host  # type: ignore[assignment]  # tensors(), counters, step
        saved = (self.packer, self.overlap_local, self.host_transport)
        # torch packs and unpacks on any device: host slices on the sender, device views on
        # the receiver (the compiled kernels hold one message on one device)
        self.packer, self.overlap_local, self.host_transport = TORCH_PACKER, False, True
        try:
            made = self._transfer(plan)
        finally:
            self.packer, self.overlap_local, self.host_transport = saved
            self.units.pop(source, None)
        for emu, st in zip(plan.targets, made, strict=True):
            if st is not None:
                self.units[emu] = st
        return made

    def destroy(self, op: Destroy, live: Iterable[Emu]) -> None:
        """Drop ``op.unit`` — only while another replica of its state is among ``live`` (the
        job's live units): never the last copy (TransitionError)."""
        check_destroy(op.unit, live)
        if self.units.pop(op.unit, None) is not None and self.device is not None:
            self.device.release_memory()  # the unit's memory back to the device

    def weight_sync(self, plan: TransferPlan) -> None:
        """Copy parameters from the train units into the existing gen units (fields=1)."""
        if plan.fields != 1:
            raise TransitionError("weight sync moves parameters only (fields=1)")
        targets = [self.units.get(e) for e in plan.targets]
        self._execute(plan, targets, self._group(plan))
        for st in targets:
            if st is not None:
                st.refresh_model()
