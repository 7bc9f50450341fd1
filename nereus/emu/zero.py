"""ZeRO partitions of a unit's optimizer state and their live re-partitioning (pure).

Under DeepSpeed ZeRO (stage 1 and 2) a unit's logical state is the full parameters (held by
every DP rank, in the model's dtype) and the fp32 master parameters and Adam moments, flattened
per optimizer param group and partitioned across the unit's DP ranks: rank r of group g holds one
flat *partition* of ``size`` values, made of *fragments* — ``numel`` consecutive values of one
parameter (flattened, from ``tensor_start``) at ``part_start`` of the partition. Alignment padding
between parameters and at the end belongs to no fragment.

Where each element lives is read from DeepSpeed's own metadata on every rank
(:func:`nereus.engines.deepspeed_engine.rank_partitions`: the optimizer's per-parameter
``_hp_mapping`` fragment addresses and ``partition_size``), never from a copy of its partitioning
rules; this module only intersects two such layouts:

- *optimizer moves* (:class:`PartMove`): every element of a target partition that the same GPU
  does not already hold in the source layout is sent once, from the one source rank whose
  partition holds it (in ZeRO every element has exactly one holder), in partition coordinates;
- *parameter moves* (:class:`ParamMove`): a GPU new to the unit receives every parameter element
  once, from the source rank whose partition holds it (the same split ZeRO's own post-step
  all-gather uses), so the senders are balanced by construction.

``bytes_min`` is computed separately from the moves (per element: does the target GPU hold it
in the source layout?) and the tests check it against an element-by-element count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from nereus.errors import TransitionError


@dataclass(frozen=True, order=True)
class Fragment:
    """``numel`` values of parameter ``tensor`` (flattened, from ``tensor_start``) stored at
    ``part_start`` of a flat partition."""

    tensor: str
    tensor_start: int
    part_start: int
    numel: int

    @property
    def tensor_stop(self) -> int:
        return self.tensor_start + self.numel


@dataclass(frozen=True)
class RankPartition:
    """What one DP rank holds of one param group: a flat partition of ``size`` values."""

    group: int
    size: int
    fragments: tuple[Fragment, ...]


@dataclass(frozen=True)
class ZeroLayout:
    """The partitions of one unit: ``parts[dp_rank][group]`` on GPU ``gpus[dp_rank]``;
    ``tensors`` (name, numel) of every parameter, in the model's order."""

    gpus: tuple[int, ...]
    tensors: tuple[tuple[str, int], ...]
    parts: tuple[tuple[RankPartition, ...], ...]

    def __post_init__(self) -> None:
        if len(self.gpus) != len(self.parts) or not self.gpus:
            raise TransitionError(f"ZeRO layout: {len(self.parts)} partitions for GPUs {self.gpus}")
        if len(set(self.gpus)) != len(self.gpus):
            raise TransitionError(f"ZeRO layout: repeated GPU in {self.gpus}")
        groups = {len(p) for p in self.parts}
        if len(groups) != 1:
            raise TransitionError("ZeRO layout: ranks disagree on the number of param groups")
        numel = dict(self.tensors)
        seen: dict[str, list[tuple[int, int]]] = {}
        for rank_parts in self.parts:
            for g, part in enumerate(rank_parts):
                if part.group != g:
                    raise TransitionError(f"ZeRO layout: group {part.group} listed as {g}")
                for fr in part.fragments:
                    if fr.tensor not in numel or fr.numel <= 0 or fr.tensor_stop > numel[fr.tensor]:
                        raise TransitionError(f"ZeRO layout: fragment {fr} outside its tensor")
                    if fr.part_start < 0 or fr.part_start + fr.numel > part.size:
                        raise TransitionError(f"ZeRO layout: fragment {fr} outside its partition")
                    seen.setdefault(fr.tensor, []).append((fr.tensor_start, fr.tensor_stop))
        for name, n in self.tensors:  # every element held exactly once
            spans = sorted(seen.get(name, []))
            at = 0
            for a, b in spans:
                if a != at:
                    raise TransitionError(f"ZeRO layout: {name} elements [{min(a, at)}, "
                                          f"{max(a, at)}) held {'twice' if a < at else 'nowhere'}")
                at = b
            if at != n:
                raise TransitionError(f"ZeRO layout: {name} elements [{at}, {n}) held nowhere")

    @property
    def dp(self) -> int:
        return len(self.gpus)

    @property
    def num_groups(self) -> int:
        return len(self.parts[0])

    @property
    def numel(self) -> int:
        return sum(n for _, n in self.tensors)

    @cached_property
    def holders(self) -> dict[tuple[int, str], tuple[tuple[int, Fragment], ...]]:
        """(group, tensor) → (dp rank, fragment) of every holder, by tensor position."""
        out: dict[tuple[int, str], list[tuple[int, Fragment]]] = {}
        for r, rank_parts in enumerate(self.parts):
            for part in rank_parts:
                for fr in part.fragments:
                    out.setdefault((part.group, fr.tensor), []).append((r, fr))
        return {k: tuple(sorted(v, key=lambda x: x[1].tensor_start)) for k, v in out.items()}

    def owned_values(self, gpu: int) -> int:
        """Values of the partitions on ``gpu`` (fragments only, no padding)."""
        if gpu not in self.gpus:
            return 0
        return sum(fr.numel for part in self.parts[self.gpus.index(gpu)] for fr in part.fragments)


@dataclass(frozen=True, order=True)
class PartMove:
    """``numel`` consecutive values of group ``group``'s partitions: from ``src_start`` on
    ``src_gpu`` (source layout) to ``dst_start`` on ``dst_gpu`` (target layout)."""

    group: int
    src_gpu: int
    dst_gpu: int
    src_start: int
    dst_start: int
    numel: int

    @property
    def is_local(self) -> bool:
        return self.src_gpu == self.dst_gpu


@dataclass(frozen=True, order=True)
class ParamMove:
    """``numel`` values of parameter ``tensor`` (flattened, from ``start``) from ``src_gpu``
    to ``dst_gpu``, a GPU new to the unit."""

    src_gpu: int
    dst_gpu: int
    tensor: str
    start: int
    numel: int


@dataclass(frozen=True)
class ZeroPlan:
    """The live re-partitioning of one unit from ``src`` to ``dst``.

    ``fields`` partition-shaped values move per element (Adam's exp_avg and exp_avg_sq, plus
    the fp32 master when the model's dtype is not fp32) of ``value_bytes`` each; parameters
    move at ``param_bytes`` per value."""

    src: ZeroLayout
    dst: ZeroLayout
    moves: tuple[PartMove, ...]
    param_moves: tuple[ParamMove, ...]
    fields: int
    value_bytes: int
    param_bytes: int
    bytes_min: int

    @property
    def bytes_moved(self) -> int:
        part = sum(m.numel for m in self.moves if not m.is_local)
        params = sum(m.numel for m in self.param_moves)
        return part * self.fields * self.value_bytes + params * self.param_bytes

    @property
    def new_gpus(self) -> tuple[int, ...]:
        return tuple(g for g in self.dst.gpus if g not in self.src.gpus)

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.src.gpus) | set(self.dst.gpus)))

    def sends(self, src_gpu: int, dst_gpu: int) -> tuple[PartMove, ...]:
        """Optimizer moves of one pair, in the order both ends pack them."""
        return tuple(m for m in self.moves if m.src_gpu == src_gpu and m.dst_gpu == dst_gpu)

    def param_sends(self, src_gpu: int, dst_gpu: int) -> tuple[ParamMove, ...]:
        return tuple(m for m in self.param_moves if m.src_gpu == src_gpu and m.dst_gpu == dst_gpu)

    def peers(self, gpu: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(GPUs ``gpu`` sends to, GPUs it receives from), itself excluded, sorted."""
        pairs = [(m.src_gpu, m.dst_gpu) for m in self.moves if not m.is_local]
        pairs += [(m.src_gpu, m.dst_gpu) for m in self.param_moves]
        return (tuple(sorted({d for s, d in pairs if s == gpu})),
                tuple(sorted({s for s, d in pairs if d == gpu})))


def _check_compatible(src: ZeroLayout, dst: ZeroLayout) -> None:
    if src.tensors != dst.tensors:
        raise TransitionError("ZeRO re-partition between layouts of different parameters")
    if src.num_groups != dst.num_groups:
        raise TransitionError(f"ZeRO re-partition: {src.num_groups} param groups to "
                              f"{dst.num_groups}")
    for key in src.holders:
        if key not in dst.holders:
            raise TransitionError(f"ZeRO re-partition: {key[1]} changes param group")


def _merged(moves: list[PartMove]) -> list[PartMove]:
    """Join moves that continue each other on both ends (fewer, larger messages)."""
    out: list[PartMove] = []
    for m in moves:
        if out:
            p = out[-1]
            if (p.group, p.src_gpu, p.dst_gpu) == (m.group, m.src_gpu, m.dst_gpu) \
                    and p.src_start + p.numel == m.src_start and p.dst_start + p.numel == m.dst_start:
                out[-1] = PartMove(p.group, p.src_gpu, p.dst_gpu, p.src_start, p.dst_start,
                                   p.numel + m.numel)
                continue
        out.append(m)
    return out


def repartition(src: ZeroLayout, dst: ZeroLayout, *, fields: int = 2, value_bytes: int = 4,
                param_bytes: int = 4) -> ZeroPlan:
    """The moves that give every target partition its values from the source partitions, and
    every GPU new to the unit its full parameters (see the module docstring)."""
    _check_compatible(src, dst)
    moves: list[PartMove] = []
    for q, rank_parts in enumerate(dst.parts):
        dst_gpu = dst.gpus[q]
        for part in rank_parts:
            for fr in sorted(part.fragments, key=lambda f: f.part_start):
                for r, sf in src.holders[(part.group, fr.tensor)]:
                    lo, hi = max(fr.tensor_start, sf.tensor_start), min(fr.tensor_stop,
                                                                         sf.tensor_stop)
                    if lo >= hi:
                        continue
                    moves.append(PartMove(part.group, src.gpus[r], dst_gpu,
                                          sf.part_start + lo - sf.tensor_start,
                                          fr.part_start + lo - fr.tensor_start, hi - lo))
    param_moves: list[ParamMove] = []
    for dst_gpu in dst.gpus:
        if dst_gpu in src.gpus:
            continue
        for r, rank_parts in enumerate(src.parts):
            frags = sorted((fr.tensor, fr.tensor_start, fr.numel) for part in rank_parts
                           for fr in part.fragments)
            param_moves += [ParamMove(src.gpus[r], dst_gpu, t, a, n) for t, a, n in frags]
    order = {name: i for i, (name, _) in enumerate(src.tensors)}
    param_moves.sort(key=lambda m: (m.dst_gpu, m.src_gpu, order[m.tensor], m.start))
    moves.sort(key=lambda m: (m.src_gpu, m.dst_gpu, m.group, m.dst_start))
    return ZeroPlan(src, dst, tuple(_merged(moves)), tuple(param_moves), fields, value_bytes,
                    param_bytes, min_bytes(src, dst, fields=fields, value_bytes=value_bytes,
                                           param_bytes=param_bytes))


def min_bytes(src: ZeroLayout, dst: ZeroLayout, *, fields: int = 2, value_bytes: int = 4,
              param_bytes: int = 4) -> int:
    """The bytes any re-partitioning must move: target partition values their GPU does not
    hold in the source layout, and the full parameters once per GPU new to the unit."""
    values = 0
    for q, rank_parts in enumerate(dst.parts):
        gpu = dst.gpus[q]
        mine: dict[tuple[int, str], list[tuple[int, int]]] = {}
        if gpu in src.gpus:
            for part in src.parts[src.gpus.index(gpu)]:
                for fr in part.fragments:
                    mine.setdefault((part.group, fr.tensor), []).append(
                        (fr.tensor_start, fr.tensor_stop))
        for part in rank_parts:
            for fr in part.fragments:
                held = sum(max(0, min(fr.tensor_stop, b) - max(fr.tensor_start, a))
                           for a, b in mine.get((part.group, fr.tensor), []))
                values += fr.numel - held
    new = sum(1 for g in dst.gpus if g not in src.gpus)
    return values * fields * value_bytes + new * src.numel * param_bytes


def layout_of(gpus: Sequence[int], tensors: Sequence[tuple[str, int]],
              rank_parts: Sequence[Sequence[RankPartition]]) -> ZeroLayout:
    """A checked :class:`ZeroLayout` from what each DP rank reported (in DP rank order)."""
    return ZeroLayout(tuple(gpus), tuple(tensors), tuple(tuple(p) for p in rank_parts))
