"""The four transition primitives as frozen DAG nodes, with the GPUs and bytes each one moves.

Shard model: position (pp_rank, tp_rank) of a unit of layout L holds the region
[tp_rank/tp, (tp_rank+1)/tp) × [pp_rank/pp, (pp_rank+1)/pp) of the logical state (a TP slice of
a contiguous range of layers), i.e. ``state_bytes / (tp·pp)``. Splitting L into T_sub gives
k = |L|/|T_sub| sub-units in one of two groupings: *interleaved* (sub-unit (bt, bp) takes
``tp_rank = j_tp·kt + bt``, ``pp_rank = j_pp·kp + bp``: the GPUs sharing a sub-unit position form
a contiguous TP/PP block, a Split is one position-wise all-gather per block and a Merge finds every
target shard resident, copying nothing) or *contiguous* (sub-unit b takes a contiguous block of
ranks, which matches how placements usually list GPUs; a Merge then copies the parts of shards not
already on their target rank). Bytes are computed from region overlaps, so they are exact for this
model under either grouping; the runtime can pass exact state sizes through a ``StateSizer``
(per-tensor transfer plans are the EMU layer's business, not this estimate's).

Tensors Megatron replicates over TP (norms, learned position embeddings) are held whole by every
TP rank: with ``replicated_bytes`` R of the state S, a position holds (S−R)/(tp·pp) + R/pp, an
Extend sends that per rank pair, and a Split or Merge moves R only where a position's pipeline
stage changes (from a source position of its own tp rank). Totals then agree with the per-tensor
plans of :func:`nereus.emu.transfer.plan_transfer` up to rounding (``tests/test_transition_bytes.py``);
per GPU the estimate spreads the state evenly over stages (embeddings and the head sit on the
first and last stage in the real model).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import cached_property, lru_cache
from operator import itemgetter

from nereus.emu.shards import REPLICATED, tensor_specs
from nereus.emu.unit import Emu, Layout
from nereus.spec.model import ModelSpec

# (model_stage) -> bytes of the whole logical state of one replica (all positions together).
StateSizer = Callable[[str], int]

ADAM_FP32_BYTES_PER_PARAM = 12  # fp32 master weights + exp_avg + exp_avg_sq


def model_state_sizer(
    models: Mapping[str, ModelSpec],
    trainable: Mapping[str, bool],
    dtype_bytes: int = 2,
) -> StateSizer:
    """Sizer from parameter counts: ``params·dtype_bytes`` (+12 B/param Adam for training)."""
    sizes = {
        name: spec.num_params()
        * (dtype_bytes + (ADAM_FP32_BYTES_PER_PARAM if trainable.get(name, False) else 0))
        for name, spec in models.items()
    }

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
    per = {name: dtype_bytes + (ADAM_FP32_BYTES_PER_PARAM if trainable.get(name, False) else 0)
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


GROUPINGS = ("interleaved", "contiguous")


def _sub_position(lay: Layout, sub: Layout, b: int, j_pp: int, j_tp: int, grouping: str) -> int:
    """Index in ``lay`` of local position (j_pp, j_tp) of sub-unit ``b``."""
    kt, kp = lay.tp // sub.tp, lay.pp // sub.pp
    bp, bt = divmod(b, kt)
    if grouping == "interleaved":
        return (j_pp * kp + bp) * lay.tp + j_tp * kt + bt
    return (bp * sub.pp + j_pp) * lay.tp + bt * sub.tp + j_tp


# The caches below are keyed by plain ints (C-level hashing): Layout hashes in Python.
def _sub_index(lay: Layout, sub: Layout, grouping: str) -> tuple[tuple[int, ...], ...]:
    return _sub_index_n(lay.tp, lay.pp, sub.tp, sub.pp, grouping)


@lru_cache(maxsize=4096)
def _sub_index_n(tp: int, pp: int, sub_tp: int, sub_pp: int, grouping: str
                 ) -> tuple[tuple[int, ...], ...]:
    lay, sub = Layout(tp, pp), Layout(sub_tp, sub_pp)
    return tuple(
        tuple(
            _sub_position(lay, sub, b, j_pp, j_tp, grouping)
            for j_pp in range(sub.pp)
            for j_tp in range(sub.tp)
        )
        for b in range(lay.size // sub.size)
    )


def groupings_differ(lay: Layout, sub: Layout) -> bool:
    """False when both groupings give the same sub-units (one split axis, or sub 1 on it)."""
    return _groupings_differ_n(lay.tp, lay.pp, sub.tp, sub.pp)


@lru_cache(maxsize=4096)
def _groupings_differ_n(tp: int, pp: int, sub_tp: int, sub_pp: int) -> bool:
    return _sub_index_n(tp, pp, sub_tp, sub_pp, GROUPINGS[0]) != \
        _sub_index_n(tp, pp, sub_tp, sub_pp, GROUPINGS[1])


@lru_cache(maxsize=4096)
def _sub_getter(tp: int, pp: int, sub_tp: int, sub_pp: int, grouping: str
                ) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
    """All sub-units' GPUs, sub-unit after sub-unit, picked from a unit's GPU tuple in C."""
    flat = [i for part in _sub_index_n(tp, pp, sub_tp, sub_pp, grouping) for i in part]
    if len(flat) == 1:
        return lambda gpus: gpus
    return itemgetter(*flat)


def sub_unit_gpus(
    unit: Emu, sub: Layout, grouping: str = "interleaved"
) -> tuple[tuple[int, ...], ...]:
    """GPU tuples of the sub-units that splitting ``unit`` into layout ``sub`` produces."""
    lay = unit.layout
    flat = _sub_getter(lay.tp, lay.pp, sub.tp, sub.pp, grouping)(unit.gpus)
    return tuple(zip(*[iter(flat)] * (sub.tp * sub.pp), strict=True))  # chunks, in C


def new_emu(model_stage: str, state: str, layout: Layout, gpus: tuple[int, ...]) -> Emu:
    """An :class:`Emu` built without re-checking what its derivation guarantees (``gpus`` are
    ``layout.size`` distinct GPUs taken from a valid unit)."""
    e = object.__new__(Emu)
    e.__dict__.update(model_stage=model_stage, state=state, layout=layout, gpus=gpus)
    return e


def sub_units(unit: Emu, sub: Layout, grouping: str = "interleaved") -> tuple[Emu, ...]:
    ms, st = unit.model_stage, unit.state
    return tuple([new_emu(ms, st, sub, g) for g in sub_unit_gpus(unit, sub, grouping)])


def merge_gpus(
    parts: tuple[tuple[int, ...], ...], sub: Layout, into: Layout, grouping: str = "interleaved"
) -> tuple[int, ...]:
    """Inverse of :func:`sub_unit_gpus`: the GPU tuple of the merged unit."""
    gpus = [0] * into.size
    for b, part in enumerate(parts):
        for j_pp in range(sub.pp):
            for j_tp in range(sub.tp):
                gpus[_sub_position(into, sub, b, j_pp, j_tp, grouping)] = part[j_pp * sub.tp + j_tp]
    return tuple(gpus)


Region = tuple[float, float, float, float]  # TP interval [t0, t1) × layer interval [p0, p1)


def region(lay: Layout, index: int) -> Region:
    """Fraction of the logical state that position ``index`` (pp_rank·tp + tp_rank) holds."""
    pp_rank, tp_rank = divmod(index, lay.tp)
    return (tp_rank / lay.tp, (tp_rank + 1) / lay.tp, pp_rank / lay.pp, (pp_rank + 1) / lay.pp)


def overlap(a: Region, b: Region) -> float:
    """Area of the intersection of two regions (a fraction of the state)."""
    dt = min(a[1], b[1]) - max(a[0], b[0])
    dp = min(a[3], b[3]) - max(a[2], b[2])
    return dt * dp if dt > 0 and dp > 0 else 0.0


def gather_areas(
    need: dict[int, Region], have: dict[int, Region], holders: list[dict[int, Region]],
) -> list[tuple[int, int, float]]:
    """``(holder, receiver, area)`` filling each key's missing part of ``need`` from one full set
    of ``holders`` (keys are GPUs or positions; a key never receives from itself).

    ``have`` is what a key holds already; each holder dict (key → region) covers the whole state
    once. The first holder set is used.
    """
    out: list[tuple[int, int, float]] = []
    for g, want in need.items():
        own = have.get(g)
        for holder in holders[:1]:
            for h, reg in holder.items():
                if h == g:
                    continue
                area = overlap(want, reg)
                if own is not None:
                    inter = (max(want[0], reg[0]), min(want[1], reg[1]),
                             max(want[2], reg[2]), min(want[3], reg[3]))
                    if inter[1] > inter[0] and inter[3] > inter[2]:
                        area -= overlap(inter, own)
                out.append((h, g, area))
    return out


def gather_transfers(
    need: dict[int, Region], have: dict[int, Region], holders: list[dict[int, Region]],
    state_bytes: int,
) -> list[Transfer]:
    """:func:`gather_areas` in bytes of a state of ``state_bytes`` (empty transfers dropped)."""
    out: list[Transfer] = []
    for h, g, area in gather_areas(need, have, holders):
        nbytes = round(area * state_bytes)
        if nbytes > 0:
            out.append(Transfer(h, g, nbytes))
    return out


Flow = tuple[int, int, int]  # (src_gpu, dst_gpu, nbytes): a Transfer as a plain tuple


@lru_cache(maxsize=4096)
def _allgather_pairs(tp: int, pp: int, sub_tp: int, sub_pp: int, grouping: str
                     ) -> tuple[tuple[int, int], ...]:
    """Split as position-wise all-gather: ``(src position, dst position)`` inside each block."""
    sub = Layout(sub_tp, sub_pp)
    idx = _sub_index_n(tp, pp, sub_tp, sub_pp, grouping)
    out: list[tuple[int, int]] = []
    for pos in range(sub.size):
        block = [part[pos] for part in idx]
        out += [(a, b) for a in block for b in block if a != b]
    return tuple(out)


@lru_cache(maxsize=4096)
def _split_areas(tp: int, pp: int, sub_tp: int, sub_pp: int, grouping: str
                 ) -> tuple[tuple[int, int, float], ...]:
    """Split by region overlaps, in positions of the source unit."""
    lay, sub = Layout(tp, pp), Layout(sub_tp, sub_pp)
    idx = _sub_index(lay, sub, grouping)
    have = {i: region(lay, i) for i in range(lay.size)}
    need = {pos: region(sub, j) for part in idx for j, pos in enumerate(part)}
    return tuple(a for a in gather_areas(need, have, [have]) if a[2] > 0)


@lru_cache(maxsize=4096)
def _merge_areas(sub_tp: int, sub_pp: int, tp: int, pp: int, grouping: str
                 ) -> tuple[tuple[int, int, float], ...]:
    """Merge of the canonical sub-units, in positions of the merged unit: each position takes
    its missing part from the first sub-unit it is not in."""
    sub, into = Layout(sub_tp, sub_pp), Layout(tp, pp)
    idx = _sub_index(into, sub, grouping)
    part_of = {pos: (b, j) for b, part in enumerate(idx) for j, pos in enumerate(part)}
    holders = [{pos: region(sub, j) for j, pos in enumerate(part)} for part in idx]
    out: list[tuple[int, int, float]] = []
    for i in range(into.size):
        b, j = part_of[i]
        others = [h for k, h in enumerate(holders) if k != b] or holders
        out += gather_areas({i: region(into, i)}, {i: region(sub, j)}, others)
    return tuple(a for a in out if a[2] > 0)


def _layer_gap(need: tuple[float, float], have: tuple[float, float], own: tuple[float, float]
               ) -> float:
    """Length of ``need`` ∩ ``have`` outside ``own`` (layer intervals, fractions of the model)."""
    lo, hi = max(need[0], have[0]), min(need[1], have[1])
    if hi <= lo:
        return 0.0
    return hi - lo - max(0.0, min(hi, own[1]) - max(lo, own[0]))


@lru_cache(maxsize=4096)
def _split_replicated_areas(tp: int, pp: int, sub_tp: int, sub_pp: int,
                            idx: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, int, float], ...]:
    """TP-replicated part of a Split (positions of the source unit; ``idx[b][j]`` is the source
    position that becomes position j of sub-unit b): each position receives the layers of its new
    stage it lacks from the source positions of its own tp rank."""
    out: list[tuple[int, int, float]] = []
    for part in idx:
        for j, i in enumerate(part):
            p, t = divmod(i, tp)
            jp = j // sub_tp
            need, own = (jp / sub_pp, (jp + 1) / sub_pp), (p / pp, (p + 1) / pp)
            for q in range(pp):
                if q != p:
                    area = _layer_gap(need, (q / pp, (q + 1) / pp), own)
                    if area > 0:
                        out.append((q * tp + t, i, area))
    return tuple(out)


@lru_cache(maxsize=4096)
def _merge_replicated_areas(sub_tp: int, sub_pp: int, tp: int, pp: int,
                            idx: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, int, float], ...]:
    """TP-replicated part of a Merge (positions of the merged unit; ``idx[b][j]`` as in
    :func:`_split_replicated_areas`): each position receives the layers of its new stage it lacks
    from the first other sub-unit, at its own tp position there."""
    out: list[tuple[int, int, float]] = []
    for b, part in enumerate(idx):
        other = idx[1] if b == 0 and len(idx) > 1 else idx[0]
        for j, i in enumerate(part):
            p = i // tp
            jp, jt = divmod(j, sub_tp)
            need, own = (p / pp, (p + 1) / pp), (jp / sub_pp, (jp + 1) / sub_pp)
            for q in range(sub_pp):
                area = _layer_gap(need, (q / sub_pp, (q + 1) / sub_pp), own)
                if area > 0:
                    out.append((other[q * sub_tp + jt], i, area))
    return tuple(out)


def _with_replicated(flows: tuple[Flow, ...], gpus: tuple[int, ...],
                     areas: tuple[tuple[int, int, float], ...], replicated_bytes: int
                     ) -> tuple[Flow, ...]:
    """``flows`` plus the replicated part's bytes, one flow per GPU pair (first-seen order)."""
    acc: dict[tuple[int, int], int] = {}
    for a, b, nbytes in flows:
        acc[(a, b)] = acc.get((a, b), 0) + nbytes
    for a, b, nbytes in _bytes_of(gpus, areas, replicated_bytes):
        acc[(a, b)] = acc.get((a, b), 0) + nbytes
    return tuple((a, b, nbytes) for (a, b), nbytes in acc.items())


def _positions(unit_gpus: tuple[int, ...], parts: tuple[Emu, ...]) -> tuple[tuple[int, ...], ...]:
    """``idx[b][j]``: the position in ``unit_gpus`` of position j of part b."""
    pos = {g: i for i, g in enumerate(unit_gpus)}
    return tuple(tuple(pos[g] for g in u.gpus) for u in parts)


def _bytes_of(gpus: tuple[int, ...], areas: tuple[tuple[int, int, float], ...],
              state_bytes: int) -> tuple[Flow, ...]:
    out: list[Flow] = []
    for a, b, area in areas:
        nbytes = round(area * state_bytes)
        if nbytes > 0:
            out.append((gpus[a], gpus[b], nbytes))
    return tuple(out)


@dataclass(frozen=True)
class Transfer:
    src_gpu: int
    dst_gpu: int
    nbytes: int


@dataclass(frozen=True)
class Split:
    """One unit → k replicas of a smaller layout on the same GPUs (all-gather per block)."""

    src: Emu
    into: tuple[Emu, ...]
    state_bytes: int
    grouping: str = "interleaved"
    replicated_bytes: int = 0  # of state_bytes: tensors every TP rank holds whole

    @property
    def model_stage(self) -> str:
        return self.src.model_stage

    @property
    def acquires(self) -> frozenset[int]:
        return frozenset()

    @property
    def releases(self) -> frozenset[int]:
        return frozenset()

    @property
    def busy_gpus(self) -> frozenset[int]:
        return frozenset(self.src.gpus)

    @property
    def comm_groups(self) -> int:
        return 1

    def transfers(self) -> tuple[Transfer, ...]:
        return tuple(Transfer(*f) for f in self.flows)

    @cached_property
    def flows(self) -> tuple[Flow, ...]:
        """Each GPU gathers the part of its new shard it lacks from the unit's other GPUs."""
        if not self.replicated_bytes:
            return self._split_flows(self.state_bytes)
        lay, sub = self.src.layout, self.into[0].layout
        areas = _split_replicated_areas(lay.tp, lay.pp, sub.tp, sub.pp,
                                        _positions(self.src.gpus, self.into))
        return _with_replicated(self._split_flows(self.state_bytes - self.replicated_bytes),
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
                             for a, b in _allgather_pairs(lay.tp, lay.pp, sub.tp, sub.pp,
                                                          self.grouping))
            out: list[Flow] = []
            for pos in range(sub.size):
                block = [u.gpus[pos] for u in self.into]
                out += [(a, b, part) for a in block for b in block if a != b]
            return tuple(out)
        if canonical:
            return _bytes_of(gpus, _split_areas(lay.tp, lay.pp, sub.tp, sub.pp, self.grouping),
                             split_bytes)
        have = {g: region(lay, i) for i, g in enumerate(self.src.gpus)}
        need = {g: region(sub, i) for u in self.into for i, g in enumerate(u.gpus)}
        return tuple((t.src_gpu, t.dst_gpu, t.nbytes)
                     for t in gather_transfers(need, have, [have], split_bytes))

    def peak_bytes(self) -> dict[int, int]:
        """Source shard kept until the collective finishes, plus the gathered shard."""
        old = shard_bytes(self.state_bytes, self.src.layout, self.replicated_bytes)
        new = shard_bytes(self.state_bytes, self.into[0].layout, self.replicated_bytes)
        return dict.fromkeys(self.src.gpus, old + new)


@dataclass(frozen=True)
class Merge:
    """k replicas → one unit of a larger layout; only the missing parts of shards are copied."""

    srcs: tuple[Emu, ...]
    into: Emu
    state_bytes: int
    grouping: str = "interleaved"
    replicated_bytes: int = 0  # of state_bytes: tensors every TP rank holds whole

    @property
    def model_stage(self) -> str:
        return self.into.model_stage

    @property
    def acquires(self) -> frozenset[int]:
        return frozenset()

    @property
    def releases(self) -> frozenset[int]:
        return frozenset()

    @property
    def busy_gpus(self) -> frozenset[int]:
        return frozenset(self.into.gpus)

    @property
    def comm_groups(self) -> int:
        return 1

    def _sides(self) -> tuple[dict[int, Region], dict[int, Region], list[dict[int, Region]]]:
        sub = self.srcs[0].layout
        have = {g: region(sub, i) for u in self.srcs for i, g in enumerate(u.gpus)}
        need = {g: region(self.into.layout, i) for i, g in enumerate(self.into.gpus)}
        holders = [{g: region(sub, i) for i, g in enumerate(u.gpus)} for u in self.srcs]
        return need, have, holders

    def transfers(self) -> tuple[Transfer, ...]:
        return tuple(Transfer(*f) for f in self.flows)

    @cached_property
    def flows(self) -> tuple[Flow, ...]:
        if not self.replicated_bytes:
            return self._merge_flows(self.state_bytes)
        sub, into = self.srcs[0].layout, self.into.layout
        areas = _merge_replicated_areas(sub.tp, sub.pp, into.tp, into.pp,
                                        _positions(self.into.gpus, self.srcs))
        return _with_replicated(self._merge_flows(self.state_bytes - self.replicated_bytes),
                                self.into.gpus, areas, self.replicated_bytes)

    def _merge_flows(self, split_bytes: int) -> tuple[Flow, ...]:
        """Flows of the part of the state (``split_bytes``) that TP splits."""
        sub, into = self.srcs[0].layout, self.into.layout
        if tuple(u.gpus for u in self.srcs) == sub_unit_gpus(self.into, sub, self.grouping):
            return _bytes_of(self.into.gpus,
                             _merge_areas(sub.tp, sub.pp, into.tp, into.pp, self.grouping),
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
