"""The shard model in position space: sub-unit maps, regions, and the transfers a Split or Merge
makes (pure; the primitives of :mod:`primitives` map these templates onto their GPUs).

Position (pp_rank, tp_rank) of a unit of layout L holds the region
[tp_rank/tp, (tp_rank+1)/tp) × [pp_rank/pp, (pp_rank+1)/pp) of the logical state (a TP slice of
a contiguous range of layers). Splitting L into T_sub gives k = |L|/|T_sub| sub-units in one of
two groupings: *interleaved* (sub-unit (bt, bp) takes ``tp_rank = j_tp·kt + bt``,
``pp_rank = j_pp·kp + bp``: the GPUs sharing a sub-unit position form a contiguous TP/PP block, a
Split is one position-wise all-gather per block and a Merge finds every target shard resident,
copying nothing) or *contiguous* (sub-unit b takes a contiguous block of ranks, which matches how
placements usually list GPUs; a Merge then copies the parts of shards not already on their target
rank). Bytes follow from region overlaps. Templates are cached per layout pair (plain-int keys,
hashed in C).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from operator import itemgetter

from nereus.emu.unit import Emu, Layout

GROUPINGS = ("interleaved", "contiguous")


def _sub_position(lay: Layout, sub: Layout, b: int, j_pp: int, j_tp: int, grouping: str) -> int:
    """Index in ``lay`` of local position (j_pp, j_tp) of sub-unit ``b``."""
    kt, kp = lay.tp // sub.tp, lay.pp // sub.pp
    bp, bt = divmod(b, kt)
    if grouping == "interleaved":
        return (j_pp * kp + bp) * lay.tp + j_tp * kt + bt
    return (bp * sub.pp + j_pp) * lay.tp + bt * sub.tp + j_tp


def _sub_index(lay: Layout, sub: Layout, grouping: str) -> tuple[tuple[int, ...], ...]:
    return sub_index_n(lay.tp, lay.pp, sub.tp, sub.pp, grouping)


@lru_cache(maxsize=4096)
def sub_index_n(tp: int, pp: int, sub_tp: int, sub_pp: int, grouping: str
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
    return sub_index_n(tp, pp, sub_tp, sub_pp, GROUPINGS[0]) != \
        sub_index_n(tp, pp, sub_tp, sub_pp, GROUPINGS[1])


@lru_cache(maxsize=4096)
def _sub_getter(tp: int, pp: int, sub_tp: int, sub_pp: int, grouping: str
                ) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
    """All sub-units' GPUs, sub-unit after sub-unit, picked from a unit's GPU tuple in C."""
    flat = [i for part in sub_index_n(tp, pp, sub_tp, sub_pp, grouping) for i in part]
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
def allgather_pairs(tp: int, pp: int, sub_tp: int, sub_pp: int, grouping: str
                     ) -> tuple[tuple[int, int], ...]:
    """Split as position-wise all-gather: ``(src position, dst position)`` inside each block."""
    sub = Layout(sub_tp, sub_pp)
    idx = sub_index_n(tp, pp, sub_tp, sub_pp, grouping)
    out: list[tuple[int, int]] = []
    for pos in range(sub.size):
        block = [part[pos] for part in idx]
        out += [(a, b) for a in block for b in block if a != b]
    return tuple(out)


@lru_cache(maxsize=4096)
def split_areas(tp: int, pp: int, sub_tp: int, sub_pp: int, grouping: str
                 ) -> tuple[tuple[int, int, float], ...]:
    """Split by region overlaps, in positions of the source unit."""
    lay, sub = Layout(tp, pp), Layout(sub_tp, sub_pp)
    idx = _sub_index(lay, sub, grouping)
    have = {i: region(lay, i) for i in range(lay.size)}
    need = {pos: region(sub, j) for part in idx for j, pos in enumerate(part)}
    return tuple(a for a in gather_areas(need, have, [have]) if a[2] > 0)


@lru_cache(maxsize=4096)
def merge_areas(sub_tp: int, sub_pp: int, tp: int, pp: int, grouping: str
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
def split_replicated_areas(tp: int, pp: int, sub_tp: int, sub_pp: int,
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
def merge_replicated_areas(sub_tp: int, sub_pp: int, tp: int, pp: int,
                            idx: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, int, float], ...]:
    """TP-replicated part of a Merge (positions of the merged unit; ``idx[b][j]`` as in
    :func:`split_replicated_areas`): each position receives the layers of its new stage it lacks
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


def with_replicated(flows: tuple[Flow, ...], gpus: tuple[int, ...],
                     areas: tuple[tuple[int, int, float], ...], replicated_bytes: int
                     ) -> tuple[Flow, ...]:
    """``flows`` plus the replicated part's bytes, one flow per GPU pair (first-seen order)."""
    acc: dict[tuple[int, int], int] = {}
    for a, b, nbytes in flows:
        acc[(a, b)] = acc.get((a, b), 0) + nbytes
    for a, b, nbytes in bytes_of(gpus, areas, replicated_bytes):
        acc[(a, b)] = acc.get((a, b), 0) + nbytes
    return tuple((a, b, nbytes) for (a, b), nbytes in acc.items())


def positions_of(unit_gpus: tuple[int, ...], parts: tuple[Emu, ...]) -> tuple[tuple[int, ...], ...]:
    """``idx[b][j]``: the position in ``unit_gpus`` of position j of part b."""
    pos = {g: i for i, g in enumerate(unit_gpus)}
    return tuple(tuple(pos[g] for g in u.gpus) for u in parts)


def bytes_of(gpus: tuple[int, ...], areas: tuple[tuple[int, int, float], ...],
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
