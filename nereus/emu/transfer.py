"""Transfer plans: for every destination (GPU, tensor) the source GPUs and slices (pure).

A plan is built by box intersection of the shard rules of the source units and the target units.
Per destination piece, elements already on the destination GPU are copied locally; every other
element is read from exactly one source, chosen among the replicas that hold it: same node
first, then the sender with the fewest bytes assigned so far (balancing), then the lowest GPU id.
Elements are counted in *values*; ``fields`` values move per element (parameter, Adam exp_avg
and exp_avg_sq: 3), each of ``value_bytes``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from nereus.emu.boxes import Box, intersect, subtract_all
from nereus.emu.primitives import TransferNode, sources_of, targets_of
from nereus.emu.shards import LocalShard, Piece, shards_at
from nereus.emu.unit import Emu
from nereus.errors import TransitionError
from nereus.spec.model import ModelSpec


@dataclass(frozen=True, order=True)
class Move:
    """Copy ``global_box`` of ``tensor`` from ``src_gpu`` (local box ``src_box`` of its tensor
    ``src_key``) to ``dst_gpu`` (local box ``dst_box`` of ``dst_key``); ``dst_unit`` indexes the
    plan's targets."""

    dst_gpu: int
    dst_unit: int
    dst_key: str
    tensor: str
    global_box: Box
    src_gpu: int
    src_unit: int
    src_key: str
    src_box: Box
    dst_box: Box

    @property
    def values(self) -> int:
        return self.global_box.volume

    @property
    def is_local(self) -> bool:
        return self.src_gpu == self.dst_gpu


@dataclass(frozen=True)
class TransferPlan:
    """All moves from ``sources`` to ``targets``; ``bytes_min`` counts destination bytes that no
    source holds on the destination GPU (computed independently of the replica choice)."""

    sources: tuple[Emu, ...]
    targets: tuple[Emu, ...]
    moves: tuple[Move, ...]
    bytes_min: int
    value_bytes: int = 4
    fields: int = 3

    @property
    def bytes_moved(self) -> int:
        return sum(m.values for m in self.moves if not m.is_local) * self.value_bytes * self.fields

    def sends(self, src_gpu: int, dst_gpu: int) -> tuple[Move, ...]:
        """Moves from one GPU to another, in the fixed order both sides pack and unpack them."""
        return tuple(m for m in self.moves if m.src_gpu == src_gpu and m.dst_gpu == dst_gpu)

    def peers(self, gpu: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(GPUs ``gpu`` sends to, GPUs it receives from), excluding itself, sorted."""
        to = sorted({m.dst_gpu for m in self.moves if m.src_gpu == gpu and m.dst_gpu != gpu})
        frm = sorted({m.src_gpu for m in self.moves if m.dst_gpu == gpu and m.src_gpu != gpu})
        return tuple(to), tuple(frm)

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted({g for e in self.sources + self.targets for g in e.gpus}))


@dataclass(frozen=True)
class _Holder:
    gpu: int
    unit: int
    shard: LocalShard
    piece: Piece


def unit_shards(spec: ModelSpec, emu: Emu) -> tuple[tuple[int, LocalShard], ...]:
    """(GPU, local shard) for every position of ``emu``."""
    out: list[tuple[int, LocalShard]] = []
    for pp_rank in range(emu.layout.pp):
        for tp_rank in range(emu.layout.tp):
            gpu = emu.gpu_at(pp_rank, tp_rank)
            out += [(gpu, s) for s in shards_at(spec, emu.layout, pp_rank, tp_rank)]
    return tuple(out)


def _to_local(piece: Piece, global_box: Box) -> Box:
    return global_box.shift(tuple(ls - gs for ls, gs in
                                  zip(piece.local.start, piece.global_.start, strict=True)))


def _aligned(h: _Holder, sources: Sequence[Emu], dst: LocalShard, dst_emu: Emu) -> bool:
    """The source's tp position projects onto the destination's (rank-aligned)."""
    return h.shard.tp_rank * dst_emu.layout.tp // sources[h.unit].layout.tp == dst.tp_rank


def plan_transfer(spec: ModelSpec, sources: Sequence[Emu], targets: Sequence[Emu], *,
                  gpus_per_node: int = 8, value_bytes: int = 4, fields: int = 3) -> TransferPlan:
    """The moves that give every target unit its shards from the source units (replicas).

    A pure function of its arguments, memoized: every rank of a transition computes the same
    plans, the per-step weight sync asks for the same one every step, and a DAG's primitives
    are planned again by each executor that runs them."""
    return _plan_transfer(spec, tuple(sources), tuple(targets), gpus_per_node, value_bytes,
                          fields)


@functools.lru_cache(maxsize=256)
def _plan_transfer(spec: ModelSpec, sources: tuple[Emu, ...], targets: tuple[Emu, ...],
                   gpus_per_node: int, value_bytes: int, fields: int) -> TransferPlan:
    src_gpus = [g for e in sources for g in e.gpus]
    if len(set(src_gpus)) != len(src_gpus):
        raise TransitionError(f"source units overlap on GPUs: {sorted(src_gpus)}")
    if not sources:
        raise TransitionError("a transfer needs at least one source unit")
    holders: dict[str, list[_Holder]] = {}
    for unit, emu in enumerate(sources):
        for gpu, shard in unit_shards(spec, emu):
            for piece in shard.pieces:
                holders.setdefault(shard.tensor, []).append(_Holder(gpu, unit, shard, piece))
    sent_values: dict[int, int] = {}
    moves: list[Move] = []
    min_values = 0
    for dst_unit, emu in enumerate(targets):
        for dst_gpu, shard in unit_shards(spec, emu):
            cands = holders.get(shard.tensor, [])
            if not cands:
                raise TransitionError(f"no source holds {shard.tensor}")
            for piece in shard.pieces:
                local_boxes: list[Box] = []
                for h in cands:
                    if h.gpu != dst_gpu:
                        continue
                    common = intersect(piece.global_, h.piece.global_)
                    if common is None:
                        continue
                    local_boxes.append(common)
                    moves.append(Move(dst_gpu, dst_unit, shard.local_key, shard.tensor, common,
                                      h.gpu, h.unit, h.shard.local_key, _to_local(h.piece, common),
                                      _to_local(piece, common)))
                rest = subtract_all(piece.global_, tuple(local_boxes))
                min_values += sum(b.volume for b in rest)
                # The reference partition: the non-replica pieces of the first source unit.
                ref = [h for h in cands if h.unit == 0 and not h.shard.tp_replica]
                for box in rest:
                    for r in ref:
                        frag = intersect(box, r.piece.global_)
                        if frag is None:
                            continue
                        best = min(
                            (h for h in cands if h.piece.global_.contains(frag)),
                            key=lambda h: (h.gpu // gpus_per_node != dst_gpu // gpus_per_node,
                                           not _aligned(h, sources, shard, emu),
                                           sent_values.get(h.gpu, 0), h.gpu),
                        )
                        sent_values[best.gpu] = sent_values.get(best.gpu, 0) + frag.volume
                        moves.append(Move(dst_gpu, dst_unit, shard.local_key, shard.tensor, frag,
                                          best.gpu, best.unit, best.shard.local_key,
                                          _to_local(best.piece, frag), _to_local(piece, frag)))
    return TransferPlan(tuple(sources), tuple(targets), tuple(moves),
                        min_values * value_bytes * fields, value_bytes, fields)


def combine_plans(plans: Sequence[TransferPlan]) -> TransferPlan:
    """Several plans executed as one pass (concurrent primitives); sources are deduplicated,
    targets concatenated in order."""
    if not plans:
        raise TransitionError("no plans to combine")
    if len({(p.value_bytes, p.fields) for p in plans}) != 1:
        raise TransitionError("combined plans must move the same fields")
    sources: list[Emu] = []
    targets: list[Emu] = []
    moves: list[Move] = []
    for p in plans:
        src_index = []
        for e in p.sources:
            if e not in sources:
                sources.append(e)
            src_index.append(sources.index(e))
        base = len(targets)
        targets += p.targets
        moves += [Move(m.dst_gpu, base + m.dst_unit, m.dst_key, m.tensor, m.global_box, m.src_gpu,
                       src_index[m.src_unit], m.src_key, m.src_box, m.dst_box) for m in p.moves]
    src_gpus = [g for e in sources for g in e.gpus]
    if len(set(src_gpus)) != len(src_gpus):
        raise TransitionError(f"combined source units overlap on GPUs: {sorted(src_gpus)}")
    return TransferPlan(tuple(sources), tuple(targets), tuple(moves),
                        sum(p.bytes_min for p in plans), plans[0].value_bytes, plans[0].fields)


def node_transfer(spec: ModelSpec, node: TransferNode, *, gpus_per_node: int = 8,
                  fields: int = 3) -> TransferPlan:
    """The exact per-tensor transfer plan of one DAG primitive (a Split, Merge or Extend record
    of :mod:`nereus.emu.primitives`): its source units' shards into its target units, by the
    shard rules of ``spec``. ``fields``: 3 for a trained model-stage (parameters and Adam's two
    moments), 1 for one that only holds weights."""
    return plan_transfer(spec, sources_of(node), targets_of(node), gpus_per_node=gpus_per_node,
                         fields=fields)


def weight_sync_plan(spec: ModelSpec, train_units: Sequence[Emu], gen_units: Sequence[Emu], *,
                     gpus_per_node: int = 8) -> TransferPlan:
    """Parameters only (one field) from the trained model-stage's units into its frozen copy's
    units (actor-train → actor-gen, critic-train → critic-inf)."""
    return plan_transfer(spec, list(train_units), list(gen_units), gpus_per_node=gpus_per_node,
                         fields=1)
