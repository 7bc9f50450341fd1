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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache

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


def shard_bytes(state_bytes: int, layout: Layout) -> int:
    """Bytes one position of a unit of ``layout`` holds (ceiling division)."""
    return -(-state_bytes // layout.size)


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


def sub_unit_gpus(
    unit: Emu, sub: Layout, grouping: str = "interleaved"
) -> tuple[tuple[int, ...], ...]:
    """GPU tuples of the sub-units that splitting ``unit`` into layout ``sub`` produces."""
    g = unit.gpus
    lay = unit.layout
    return tuple(tuple(g[i] for i in idx)
                 for idx in _sub_index_n(lay.tp, lay.pp, sub.tp, sub.pp, grouping))


def sub_units(unit: Emu, sub: Layout, grouping: str = "interleaved") -> tuple[Emu, ...]:
    return tuple(
        Emu(unit.model_stage, unit.state, sub, g) for g in sub_unit_gpus(unit, sub, grouping)
    )


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
    return tuple(gather_areas(need, have, [have]))


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
    return tuple(out)


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
        lay, sub = self.src.layout, self.into[0].layout
        gpus = self.src.gpus
        canonical = tuple(u.gpus for u in self.into) == sub_unit_gpus(self.src, sub, self.grouping)
        if self.grouping == "interleaved" or not groupings_differ(lay, sub):
            # position-wise all-gather: every block member sends its whole shard to the others
            part = round(self.state_bytes / lay.size)
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
                             self.state_bytes)
        have = {g: region(lay, i) for i, g in enumerate(self.src.gpus)}
        need = {g: region(sub, i) for u in self.into for i, g in enumerate(u.gpus)}
        return tuple((t.src_gpu, t.dst_gpu, t.nbytes)
                     for t in gather_transfers(need, have, [have], self.state_bytes))

    def peak_bytes(self) -> dict[int, int]:
        """Source shard kept until the collective finishes, plus the gathered shard."""
        old = shard_bytes(self.state_bytes, self.src.layout)
        new = shard_bytes(self.state_bytes, self.into[0].layout)
        return dict.fromkeys(self.src.gpus, old + new)


@dataclass(frozen=True)
class Merge:
    """k replicas → one unit of a larger layout; only the missing parts of shards are copied."""

    srcs: tuple[Emu, ...]
    into: Emu
    state_bytes: int
    grouping: str = "interleaved"

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
        sub, into = self.srcs[0].layout, self.into.layout
        if tuple(u.gpus for u in self.srcs) == sub_unit_gpus(self.into, sub, self.grouping):
            return _bytes_of(self.into.gpus,
                             _merge_areas(sub.tp, sub.pp, into.tp, into.pp, self.grouping),
                             self.state_bytes)
        need, have, holders = self._sides()
        out: list[Flow] = []
        for g, want in need.items():
            # take from the replica that is not this GPU's own (it lacks exactly this part)
            others = [h for h in holders if g not in h] or holders
            out += [(t.src_gpu, t.dst_gpu, t.nbytes) for t in
                    gather_transfers({g: want}, {g: have[g]}, others, self.state_bytes)]
        return tuple(out)

    def peak_bytes(self) -> dict[int, int]:
        """Resident sub-unit shard plus the received missing part."""
        base = shard_bytes(self.state_bytes, self.srcs[0].layout)
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
        sb = shard_bytes(self.state_bytes, self.src.layout)
        return tuple((a, b, sb) for a, b in zip(self.src.gpus, self.new.gpus, strict=True))

    def peak_bytes(self) -> dict[int, int]:
        """Sender: resident shard + one contiguous send buffer; receiver: the new shard."""
        sb = shard_bytes(self.state_bytes, self.src.layout)
        out = dict.fromkeys(self.src.gpus, 2 * sb)
        out.update(dict.fromkeys(self.new.gpus, sb))
        return out


@dataclass(frozen=True)
class Destroy:
    """Local teardown of one redundant unit; frees its GPUs."""

    unit: Emu
    state_bytes: int

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
        return dict.fromkeys(self.unit.gpus, shard_bytes(self.state_bytes, self.unit.layout))


Primitive = Split | Merge | Extend | Destroy

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
