"""Split / Merge / Extend / Destroy: the one primitive vocabulary, from planning to execution.

These frozen records are the nodes of the transition DAG (:mod:`nereus.transition`), what travels
to the ranks (:mod:`nereus.transition.wire`) and what the ranks execute
(:mod:`nereus.runtime.execution`). Each names its units (:class:`~nereus.emu.unit.Emu`) and the
size of the logical state it moves; two views of its bytes follow from it:

- *analytic* (here, for planning and L̂_tran): position (pp_rank, tp_rank) of a unit of layout L
  holds a TP slice of a contiguous range of layers, ``state_bytes / (tp·pp)``; a Split or Merge
  moves the parts of the new shards a position lacks, by region overlaps under either sub-unit
  grouping (:mod:`nereus.emu.regions`). Tensors Megatron replicates over TP (norms, learned
  position embeddings) are held whole by every TP rank: with ``replicated_bytes`` R of the state
  S, a position holds (S−R)/(tp·pp) + R/pp, an Extend sends that per rank pair, and a Split or
  Merge moves R only where a position's pipeline stage changes. Per GPU the estimate spreads the
  state evenly over stages (embeddings and the head sit on the first and last stage in the real
  model).
- *exact* (:func:`nereus.emu.transfer.node_transfer`, computed where the node is executed): the
  per-tensor transfer plan from the shard rules of the model (:mod:`nereus.emu.shards`). Totals
  agree with the analytic ones up to rounding (``tests/pure/test_transition_bytes.py``).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property

from nereus.emu.regions import (
    GROUPINGS,
    Flow,
    Region,
    Transfer,
    allgather_pairs,
    bytes_of,
    gather_transfers,
    groupings_differ,
    merge_areas,
    merge_gpus,
    merge_replicated_areas,
    positions_of,
    region,
    split_areas,
    split_replicated_areas,
    sub_unit_gpus,
    sub_units,
    with_replicated,
)
from nereus.emu.shards import REPLICATED, tensor_specs
from nereus.emu.unit import Emu, Layout
from nereus.errors import TransitionError
from nereus.spec.model import ModelSpec, state_bytes_per_param

# (model_stage) -> bytes of the whole logical state of one replica (all positions together).
StateSizer = Callable[[str], int]



def model_state_sizer(
    models: Mapping[str, ModelSpec],
    trainable: Mapping[str, bool],
    dtype_bytes: int = 2,
) -> StateSizer:
    """Sizer from parameter counts: ``params·dtype_bytes`` (+12 B/param Adam for training)."""
    sizes = {name: spec.num_params() * state_bytes_per_param(dtype_bytes,
                                                             trainable.get(name, False))
             for name, spec in models.items()}

    def size_bytes(model_stage: str) -> int:
        return sizes[model_stage]

    return size_bytes


def model_replicated_sizer(
    models: Mapping[str, ModelSpec],
    trainable: Mapping[str, bool],
    dtype_bytes: int = 2,
) -> StateSizer:
    """Bytes of the TP-replicated tensors of each model-stage's state, in the units of
    :func:`model_state_sizer` (pass both to the compiler)."""
    per = {name: state_bytes_per_param(dtype_bytes, trainable.get(name, False))
           for name in models}
    sizes = {name: replicated_params(spec) * per[name] for name, spec in models.items()}

    def size_bytes(model_stage: str) -> int:
        return sizes[model_stage]

    return size_bytes


def replicated_params(spec: ModelSpec) -> int:
    """Parameters every TP rank holds whole (norms, learned position embeddings)."""
    return sum(math.prod(t.global_shape) for t in tensor_specs(spec) if t.kind == REPLICATED)


def shard_bytes(state_bytes: int, layout: Layout, replicated_bytes: int = 0) -> int:
    """Bytes one position of a unit of ``layout`` holds (ceiling division): its TP×PP slice of
    the state, where the ``replicated_bytes`` of it (tensors every TP rank holds whole) are only
    split over pipeline stages."""
    if not replicated_bytes:
        return -(-state_bytes // layout.size)
    return -(-(state_bytes - replicated_bytes) // layout.size) - (-replicated_bytes // layout.pp)


class _InPlace:
    """What Split and Merge share: a reshaping of one model-stage's units on the GPUs of
    ``held`` (a Split's source, a Merge's result), which it keeps busy; it acquires and
    releases no GPU and moves its ``flows`` over one communicator."""

    @property
    def held(self) -> Emu:
        raise NotImplementedError

    @property
    def flows(self) -> tuple[Flow, ...]:
        raise NotImplementedError

    @property
    def model_stage(self) -> str:
        return self.held.model_stage

    @property
    def acquires(self) -> frozenset[int]:
        return frozenset()

    @property
    def releases(self) -> frozenset[int]:
        return frozenset()

    @property
    def busy_gpus(self) -> frozenset[int]:
        return frozenset(self.held.gpus)

    @property
    def comm_groups(self) -> int:
        return 1

    def transfers(self) -> tuple[Transfer, ...]:
        return tuple(Transfer(*f) for f in self.flows)


@dataclass(frozen=True)
class Split(_InPlace):
    """One unit → k replicas of a smaller layout on the same GPUs (all-gather per block)."""

    src: Emu
    into: tuple[Emu, ...]
    state_bytes: int
    grouping: str = "interleaved"
    replicated_bytes: int = 0  # of state_bytes: tensors every TP rank holds whole

    @property
    def held(self) -> Emu:
        return self.src

    @cached_property
    def flows(self) -> tuple[Flow, ...]:
        """Each GPU gathers the part of its new shard it lacks from the unit's other GPUs."""
        if not self.replicated_bytes:
            return self._split_flows(self.state_bytes)
        lay, sub = self.src.layout, self.into[0].layout
        areas = split_replicated_areas(lay.tp, lay.pp, sub.tp, sub.pp,
                                        positions_of(self.src.gpus, self.into))
        return with_replicated(self._split_flows(self.state_bytes - self.replicated_bytes),
                                self.src.gpus, areas, self.replicated_bytes)

    def _split_flows(self, split_bytes: int) -> tuple[Flow, ...]:
        """Flows of the part of the state (``split_bytes``) that TP splits."""
        lay, sub = self.src.layout, self.into[0].layout
        gpus = self.src.gpus
        canonical = tuple(u.gpus for u in self.into) == sub_unit_gpus(self.src, sub, self.grouping)
        if self.grouping == "interleaved" or not groupings_differ(lay, sub):
            # position-wise all-gather: every block member sends its whole shard to the others
            part = round(split_bytes / lay.size)
            if canonical:
                return tuple((gpus[a], gpus[b], part)
                             for a, b in allgather_pairs(lay.tp, lay.pp, sub.tp, sub.pp,
                                                          self.grouping))
            out: list[Flow] = []
            for pos in range(sub.size):
                block = [u.gpus[pos] for u in self.into]
                out += [(a, b, part) for a in block for b in block if a != b]
            return tuple(out)
        if canonical:
            return bytes_of(gpus, split_areas(lay.tp, lay.pp, sub.tp, sub.pp, self.grouping),
                             split_bytes)
        have = {g: region(lay, i) for i, g in enumerate(self.src.gpus)}
        need = {g: region(sub, i) for u in self.into for i, g in enumerate(u.gpus)}
        return tuple((t.src_gpu, t.dst_gpu, t.nbytes)
                     for t in gather_transfers(need, have, [have], split_bytes))

    def blocks(self) -> tuple[tuple[int, ...], ...]:
        """GPU groups of the position-wise all-gather: the GPUs that share a new position."""
        by_pos: dict[int, list[int]] = {}
        for unit in self.into:
            for pos, gpu in enumerate(unit.gpus):
                by_pos.setdefault(pos, []).append(gpu)
        return tuple(tuple(sorted(g)) for _, g in sorted(by_pos.items()))

    def peak_bytes(self) -> dict[int, int]:
        """Source shard kept until the collective finishes, plus the gathered shard."""
        old = shard_bytes(self.state_bytes, self.src.layout, self.replicated_bytes)
        new = shard_bytes(self.state_bytes, self.into[0].layout, self.replicated_bytes)
        return dict.fromkeys(self.src.gpus, old + new)


@dataclass(frozen=True)
class Merge(_InPlace):
    """k replicas → one unit of a larger layout; only the missing parts of shards are copied."""

    srcs: tuple[Emu, ...]
    into: Emu
    state_bytes: int
    grouping: str = "interleaved"
    replicated_bytes: int = 0  # of state_bytes: tensors every TP rank holds whole

    @property
    def held(self) -> Emu:
        return self.into

    def _sides(self) -> tuple[dict[int, Region], dict[int, Region], list[dict[int, Region]]]:
        sub = self.srcs[0].layout
        have = {g: region(sub, i) for u in self.srcs for i, g in enumerate(u.gpus)}
        need = {g: region(self.into.layout, i) for i, g in enumerate(self.into.gpus)}
        holders = [{g: region(sub, i) for i, g in enumerate(u.gpus)} for u in self.srcs]
        return need, have, holders

    @cached_property
    def flows(self) -> tuple[Flow, ...]:
        if not self.replicated_bytes:
            return self._merge_flows(self.state_bytes)
        sub, into = self.srcs[0].layout, self.into.layout
        areas = merge_replicated_areas(sub.tp, sub.pp, into.tp, into.pp,
                                        positions_of(self.into.gpus, self.srcs))
        return with_replicated(self._merge_flows(self.state_bytes - self.replicated_bytes),
                                self.into.gpus, areas, self.replicated_bytes)

    def _merge_flows(self, split_bytes: int) -> tuple[Flow, ...]:
        """Flows of the part of the state (``split_bytes``) that TP splits."""
        sub, into = self.srcs[0].layout, self.into.layout
        if tuple(u.gpus for u in self.srcs) == sub_unit_gpus(self.into, sub, self.grouping):
            return bytes_of(self.into.gpus,
                             merge_areas(sub.tp, sub.pp, into.tp, into.pp, self.grouping),
                             split_bytes)
        need, have, holders = self._sides()
        out: list[Flow] = []
        for g, want in need.items():
            # take from the replica that is not this GPU's own (it lacks exactly this part)
            others = [h for h in holders if g not in h] or holders
            out += [(t.src_gpu, t.dst_gpu, t.nbytes) for t in
                    gather_transfers({g: want}, {g: have[g]}, others, split_bytes)]
        return tuple(out)

    def peak_bytes(self) -> dict[int, int]:
        """Resident sub-unit shard plus the received missing part."""
        base = shard_bytes(self.state_bytes, self.srcs[0].layout, self.replicated_bytes)
        out = dict.fromkeys(self.into.gpus, base)
        for _, dst, nbytes in self.flows:
            out[dst] += nbytes
        return out


@dataclass(frozen=True)
class Extend:
    """A new replica on newly acquired GPUs: rank-aligned pairwise copies, one shard each."""

    src: Emu
    new: Emu
    state_bytes: int
    replicated_bytes: int = 0  # of state_bytes: tensors every TP rank holds whole

    @property
    def model_stage(self) -> str:
        return self.new.model_stage

    @property
    def acquires(self) -> frozenset[int]:
        return frozenset(self.new.gpus)

    @property
    def releases(self) -> frozenset[int]:
        return frozenset()

    @property
    def busy_gpus(self) -> frozenset[int]:
        return frozenset(self.src.gpus) | frozenset(self.new.gpus)

    @property
    def comm_groups(self) -> int:
        return 1  # the pair communicators are created concurrently

    def transfers(self) -> tuple[Transfer, ...]:
        return tuple(Transfer(*f) for f in self.flows)

    @property
    def flows(self) -> tuple[Flow, ...]:
        sb = shard_bytes(self.state_bytes, self.src.layout, self.replicated_bytes)
        return tuple((a, b, sb) for a, b in zip(self.src.gpus, self.new.gpus, strict=True))

    def peak_bytes(self) -> dict[int, int]:
        """Sender: resident shard + one contiguous send buffer; receiver: the new shard."""
        sb = shard_bytes(self.state_bytes, self.src.layout, self.replicated_bytes)
        out = dict.fromkeys(self.src.gpus, 2 * sb)
        out.update(dict.fromkeys(self.new.gpus, sb))
        return out


@dataclass(frozen=True)
class Destroy:
    """Local teardown of one redundant unit; frees its GPUs."""

    unit: Emu
    state_bytes: int
    replicated_bytes: int = 0  # of state_bytes: tensors every TP rank holds whole

    @property
    def model_stage(self) -> str:
        return self.unit.model_stage

    @property
    def acquires(self) -> frozenset[int]:
        return frozenset()

    @property
    def releases(self) -> frozenset[int]:
        return frozenset(self.unit.gpus)

    @property
    def busy_gpus(self) -> frozenset[int]:
        return frozenset(self.unit.gpus)

    @property
    def comm_groups(self) -> int:
        return 0

    def transfers(self) -> tuple[Transfer, ...]:
        return ()

    @property
    def flows(self) -> tuple[Flow, ...]:
        return ()

    def peak_bytes(self) -> dict[int, int]:
        return dict.fromkeys(self.unit.gpus, shard_bytes(self.state_bytes, self.unit.layout,
                                                         self.replicated_bytes))


Primitive = Split | Merge | Extend | Destroy

_FIELD_NAMES = {cls: tuple(f.name for f in fields(cls)) for cls in (Split, Merge, Extend, Destroy)}


def record(cls: type[Primitive], *values: object) -> Primitive:
    """``cls(*values)`` given every field in order, without the generated ``__init__`` (the
    compiler builds hundreds per plan; the records are the same)."""
    p = object.__new__(cls)
    p.__dict__.update(zip(_FIELD_NAMES[cls], values, strict=True))
    return p

KIND_ORDER: dict[type, int] = {Destroy: 0, Split: 1, Extend: 2, Merge: 3}  # release first


def consumed(p: Primitive) -> tuple[Emu, ...]:
    """Units a primitive ends (an Extend's source stays live)."""
    if isinstance(p, Split):
        return (p.src,)
    if isinstance(p, Merge):
        return p.srcs
    if isinstance(p, Destroy):
        return (p.unit,)
    return ()


def produced(p: Primitive) -> tuple[Emu, ...]:
    if isinstance(p, Split):
        return p.into
    if isinstance(p, Merge):
        return (p.into,)
    if isinstance(p, Extend):
        return (p.new,)
    return ()


def read_only(p: Primitive) -> tuple[Emu, ...]:
    return (p.src,) if isinstance(p, Extend) else ()


TransferNode = Split | Merge | Extend  # the primitives that move bytes


def sources_of(p: TransferNode) -> tuple[Emu, ...]:
    """The units whose shards a transfer primitive reads."""
    if isinstance(p, Merge):
        return p.srcs
    return (p.src,)


def targets_of(p: TransferNode) -> tuple[Emu, ...]:
    """The units a transfer primitive fills."""
    return produced(p)


# -- building single primitives (the compiler builds them in bulk; tests and benchmarks, and
# -- anyone driving the executor by hand, build them here) ------------------------------------

def split_node(unit: Emu, sub: Layout, state_bytes: int = 0, *, grouping: str = "interleaved",
               replicated_bytes: int = 0) -> Split:
    """Split ``unit`` into the sub-units of layout ``sub`` on the same GPUs (``grouping``: how
    positions form sub-units, see :mod:`nereus.emu.regions`)."""
    if grouping not in GROUPINGS:
        raise TransitionError(f"unknown grouping {grouping!r}")
    if not sub.divides(unit.layout):
        raise TransitionError(f"{sub} does not divide {unit.layout}")
    return Split(unit, sub_units(unit, sub, grouping), state_bytes, grouping, replicated_bytes)


def merge_node(units: Sequence[Emu], layout: Layout, state_bytes: int = 0, *,
               grouping: str = "interleaved", replicated_bytes: int = 0) -> Merge:
    """Merge the replicas ``units`` (in sub-unit order) into one unit of ``layout``: the unit
    that :func:`split_node` would split into them."""
    if not units:
        raise TransitionError("merge of no units")
    sub = units[0].layout
    if not sub.divides(layout):
        raise TransitionError(f"{sub} does not divide {layout}")
    if len(units) != layout.size // sub.size:
        raise TransitionError(f"merging {len(units)} units of {sub} into {layout} needs "
                              f"{layout.size // sub.size}")
    for u in units:
        if u.layout != sub or u.state != units[0].state or u.model_stage != units[0].model_stage:
            raise TransitionError(f"merge of non-replicas: {u} vs {units[0]}")
    gpus = merge_gpus(tuple(u.gpus for u in units), sub, layout, grouping)
    into = Emu(units[0].model_stage, units[0].state, layout, gpus)
    return Merge(tuple(units), into, state_bytes, grouping, replicated_bytes)


def extend_node(src: Emu, gpus: Sequence[int], state_bytes: int = 0, *,
                replicated_bytes: int = 0) -> Extend:
    """A new replica of ``src`` on ``gpus`` (disjoint from it, same layout)."""
    if set(src.gpus) & set(gpus):
        raise TransitionError(f"extend onto GPUs already in use: {sorted(set(src.gpus) & set(gpus))}")
    return Extend(src, Emu(src.model_stage, src.state, src.layout, tuple(gpus)), state_bytes,
                  replicated_bytes)


def check_destroy(unit: Emu, live: Iterable[Emu]) -> tuple[Emu, ...]:
    """The other replicas of ``unit``'s state among ``live`` (on other GPUs); TransitionError when
    there is none: the last copy of a state is never destroyed (DESIGN.md §2.2)."""
    survivors = tuple(u for u in live if u != unit and u.state == unit.state
                      and u.model_stage == unit.model_stage
                      and not set(u.gpus) & set(unit.gpus))
    if not survivors:
        raise TransitionError(
            f"refusing to destroy the last copy of {unit.model_stage}/{unit.state} on {unit.gpus}")
    return survivors
