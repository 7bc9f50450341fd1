"""Live DP change of a DeepSpeed ZeRO unit: re-partition its state over gloo (effectful).

A ZeRO unit's DP ranks do not hold replicas: each holds one partition of the optimizer state
(stage 1 and 2: the fp32 master parameters and Adam's moments; the parameters themselves are
whole on every rank). So a DP change is not an Extend of a replica plus Destroys: the target
unit is built at the new DP (DeepSpeed's engine over the new DP group, parameters unwritten),
both units report their partitions from DeepSpeed's metadata, and the pure plan
(:func:`nereus.emu.zero.repartition`) moves every element whose owner changes once, from its one
holder; a GPU new to the unit also receives the parameters once. Transfers go over a gloo
group of the transition's GPUs (unique store prefix, bounded timeout): slices of at least
:data:`~nereus.runtime.execution.pack.DIRECT_MIN_VALUES` values go straight from the source
tensors into the target's (no copy), smaller ones packed into one buffer per pair; the moves
inside a rank are copies. The fp32 master partition is then the parameters' values at the
partition (the models are fp32: DeepSpeed builds it the same way), the Adam step and the unit's
counters come from the source. The source unit is left intact until the caller
drops it, so a failed transfer (CommunicationError) loses nothing.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from nereus.emu.zero import (
    Fragment,
    PartMove,
    RankPartition,
    ZeroLayout,
    ZeroPlan,
    layout_of,
    repartition,
)
from nereus.engines.deepspeed_engine import MOMENTS, ZeroUnit
from nereus.errors import CommunicationError, TransitionError
from nereus.runtime.execution.groups import TransitionGroup, transition_group
from nereus.runtime.execution.pack import PairMessages, pack, pair_messages, unpack

META_VALUES = 5  # updates, model-stage version, policy version, position, Adam step


@dataclass(frozen=True)
class ZeroChange:
    """What one rank saw of a re-partition: the plan and its wall and transfer seconds."""

    plan: ZeroPlan
    seconds: float
    transfer_s: float


def gather_layouts(source: ZeroUnit | None, target: ZeroUnit | None, src_gpus: Sequence[int],
                   dst_gpus: Sequence[int], group: Any = None) -> tuple[ZeroLayout, ZeroLayout]:
    """Both layouts from what each rank reads of DeepSpeed's metadata (collective over
    ``group``, default the whole job: every rank calls it)."""

    def plain(parts: Sequence[RankPartition] | None) -> Any:
        return None if parts is None else [
            [p.group, p.size, [[f.tensor, f.tensor_start, f.part_start, f.numel]
                               for f in p.fragments]] for p in parts]

    def back(parts: Any) -> tuple[RankPartition, ...] | None:
        return None if parts is None else tuple(
            RankPartition(int(g), int(n), tuple(Fragment(str(t), int(a), int(b), int(k))
                                                for t, a, b, k in frags))
            for g, n, frags in parts)

    unit = source if source is not None else target
    mine = [dist.get_rank(), plain(source.partitions() if source is not None else None),
            plain(target.partitions() if target is not None else None),
            None if unit is None else [[n, int(k)] for n, k in unit.tensor_numels]]
    by_rank: dict[int, Any] = {int(r): (back(s), back(t), None if n is None else tuple((str(a), int(b))
                                                                        for a, b in n))
               for r, s, t, n in _all_gather_json(mine, group)}
    tensors = next(t for _, (_, _, t) in sorted(by_rank.items()) if t is not None)
    src = layout_of(src_gpus, tensors, [by_rank[g][0] for g in src_gpus])
    dst = layout_of(dst_gpus, tensors, [by_rank[g][1] for g in dst_gpus])
    return src, dst


def _all_gather_json(obj: Any, group: Any) -> list[Any]:
    """Every rank's ``obj`` (plain data) over ``group`` as JSON bytes in uint8 tensors: nothing
    received over torch.distributed is unpickled (docs/security.md)."""
    data = json.dumps(obj, separators=(",", ":")).encode()
    world = dist.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=group)
    width = max(int(n.item()) for n in sizes)
    mine = torch.zeros(width, dtype=torch.uint8)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    got = [torch.zeros(width, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(got, mine, group=group)
    return [json.loads(bytes(g[:int(n.item())].numpy())) for g, n in zip(got, sizes, strict=True)]


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.detach().view(-1)


def _views(plan: ZeroPlan, unit: ZeroUnit, src: int, dst: int, at_source: bool
           ) -> list[torch.Tensor]:
    """The slices of ``unit`` the pair (src → dst) moves — the Adam moments' partition slices
    (at the source's offsets or the target's), then the parameters' slices."""
    params = unit.params()
    views = [unit.moment(m.group, k)[(a := m.src_start if at_source else m.dst_start):a + m.numel]
             for m in plan.sends(src, dst) for k in MOMENTS]
    views += [_flat(params[m.tensor])[m.start:m.start + m.numel]
              for m in plan.param_sends(src, dst)]
    return views


def _messages(views: Sequence[torch.Tensor]) -> PairMessages:
    """Both ends split a pair's slices alike: large ones (all 1-D contiguous) go as their own
    messages with no copy, the rest packed into one buffer (tag 0; direct item k: tag 2 + k)."""
    return pair_messages([v.numel() for v in views], [v.is_contiguous() for v in views])


def _meta(unit: ZeroUnit) -> torch.Tensor:
    c = unit.counters
    vals = [0, 0, 0, 0] if c is None else [c.updates, c.model_stage_version, c.policy_version,
                                           c.position]
    return torch.tensor([*vals, round(unit.step_value())], dtype=torch.int64)


def execute_zero_plan(plan: ZeroPlan, rank: int, source: ZeroUnit | None,
                      target: ZeroUnit | None, group: TransitionGroup | None,
                      on_transfers_done: Callable[[], None] | None = None) -> None:
    """Run ``plan`` on this rank (``source``/``target``: its parts of the two units, or None)."""
    if plan.fields != len(MOMENTS):
        raise TransitionError(f"ZeRO plan of {plan.fields} fields; fp32 units move "
                              f"{len(MOMENTS)} (Adam's moments)")
    to, frm = plan.peers(rank)
    new_here = target is not None and rank not in plan.src.gpus
    meta_to = [g for g in plan.new_gpus if rank == min(plan.src.gpus)] if source else []
    works: list[tuple[str, int, Any, Callable[[], None] | None]] = []
    keep: list[torch.Tensor] = []
    meta = torch.empty(META_VALUES, dtype=torch.int64)
    doing = "posting transfers"
    try:
        if to or frm or meta_to or new_here:
            if group is None:
                raise TransitionError(f"rank {rank} must transfer but has no transition group")
            for peer in to:
                assert source is not None
                views = _views(plan, source, rank, peer, at_source=True)
                msgs = _messages(views)
                dest = group.group_rank(peer)
                for k, i in enumerate(msgs.direct):  # large slices straight from the tensors
                    works.append(("send to", peer, group.pg.send([views[i]], dest, 2 + k), None))
                if msgs.packed:
                    buf = pack([views[i] for i in msgs.packed])
                    keep.append(buf)
                    works.append(("send to", peer, group.pg.send([buf], dest, 0), None))
            for peer in meta_to:
                works.append(("send meta to", peer, group.pg.send(
                    [_meta(source)], group.group_rank(peer), 1), None))  # type: ignore[arg-type]
            for peer in frm:
                assert target is not None
                views = _views(plan, target, peer, rank, at_source=False)
                msgs = _messages(views)
                frm_rank = group.group_rank(peer)
                for k, i in enumerate(msgs.direct):  # straight into the target's slices
                    works.append(("recv from", peer,
                                  group.pg.recv([views[i]], frm_rank, 2 + k), None))
                if msgs.packed:
                    packed = [views[i] for i in msgs.packed]
                    buf = torch.empty(sum(v.numel() for v in packed), dtype=torch.float32)
                    post: Callable[[], None] = functools.partial(unpack, buf, packed)
                    works.append(("recv from", peer, group.pg.recv([buf], frm_rank, 0), post))
            if new_here:
                peer = min(plan.src.gpus)
                works.append(("recv meta from", peer,
                              group.pg.recv([meta], group.group_rank(peer), 1), None))
    except (RuntimeError, dist.DistError) as e:
        raise _comm_error(rank, doing, group, e) from e
    with torch.no_grad():
        for what, peer, w, after in works:
            try:
                w.wait(timedelta(seconds=group.timeout_s if group else 0.0))
            except (RuntimeError, dist.DistError) as e:
                raise _comm_error(rank, f"{what} rank {peer}", group, e) from e
            if after is not None:
                after()
        if on_transfers_done is not None:
            on_transfers_done()
        if target is None:
            return
        if source is not None:  # a GPU staying in the unit: its own parts are copies
            for m in plan.sends(rank, rank):
                for key in MOMENTS:
                    _local(target, source, m, key)
            src_params = source.params()
            for name, p in target.params().items():
                p.data.copy_(src_params[name].data)
            meta = _meta(source)
        _finish(target, meta)


def _local(target: ZeroUnit, source: ZeroUnit, m: PartMove, key: str) -> None:
    target.moment(m.group, key)[m.dst_start:m.dst_start + m.numel].copy_(
        source.moment(m.group, key)[m.src_start:m.src_start + m.numel])


def _finish(target: ZeroUnit, meta: torch.Tensor) -> None:
    """The fp32 master partition from the parameters (by DeepSpeed's fragments), the Adam step
    and the counters."""
    params = target.params()
    for part in target.partitions():
        hp = target.hp(part.group)
        for fr in part.fragments:
            hp[fr.part_start:fr.part_start + fr.numel].copy_(
                _flat(params[fr.tensor])[fr.tensor_start:fr.tensor_stop])
    target.set_step(float(meta[4]))
    if target.counters is not None:
        c = target.counters
        c.updates, c.model_stage_version, c.policy_version, c.position = (
            int(v) for v in meta[:4])


def _comm_error(rank: int, doing: str, group: TransitionGroup | None,
                e: BaseException) -> CommunicationError:
    first = str(e).splitlines()[0] if str(e) else repr(e)
    timeout = group.timeout_s if group is not None else 0.0
    return CommunicationError(f"rank {rank}: ZeRO re-partition: {doing} failed "
                              f"(timeout {timeout:g} s): {first}")


def change_dp(source: ZeroUnit | None, target: ZeroUnit | None, src_gpus: Sequence[int],
              dst_gpus: Sequence[int], rank: int, store: dist.Store, name: str, *,
              timeout_s: float) -> ZeroChange:
    """Every rank of the job: re-partition a unit from ``src_gpus`` onto the (already built)
    target unit on ``dst_gpus``. ``name`` is unique per transition (the gloo group's prefix)."""
    t0 = time.perf_counter()
    src, dst = gather_layouts(source, target, src_gpus, dst_gpus)
    plan = repartition(src, dst)
    pairs = {(m.src_gpu, m.dst_gpu) for m in plan.moves if not m.is_local}
    pairs |= {(m.src_gpu, m.dst_gpu) for m in plan.param_moves}
    pairs |= {(min(plan.src.gpus), g) for g in plan.new_gpus}
    members = tuple(sorted({g for p in pairs for g in p}))
    group = None
    if rank in members:
        group = transition_group(store, name, members, rank, timeout_s)
    t1 = time.perf_counter()
    xfer = [0.0]

    def done() -> None:
        xfer[0] = time.perf_counter() - t1

    execute_zero_plan(plan, rank, source, target, group, done)
    return ZeroChange(plan, time.perf_counter() - t0, xfer[0])
