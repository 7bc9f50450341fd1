"""Per-GPU bytes of a batched local DAG: the levels and the ``fits`` check of
:func:`compile.compile_transition` on arrays (0 bytes stands for "holds nothing there"; every
unit holds at least one byte, so that is the same as a missing key)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from nereus.emu.primitives import shard_bytes
from nereus.emu.unit import Layout
from nereus.transition.batched.blocks import (
    CONTIGUOUS,
    DESTROY,
    EXTEND,
    INTERLEAVED,
    MERGE,
    SPLIT,
    Block,
    LocalArrays,
)
from nereus.transition.batched.cost import flow_template
from nereus.transition.residency import Exclusion


def merge_received(blk: Block, state_bytes: int, rep: int, grouping: int) -> np.ndarray:
    """Bytes each position of a merged unit receives (the Merge's peak above its part)."""
    sub = blk.sub
    assert sub is not None
    return _received(blk.lay.tp, blk.lay.pp, sub.tp, sub.pp, grouping, state_bytes, rep)


@lru_cache(maxsize=4096)
def _block_peak(kind: int, tp: int, pp: int, sub_tp: int, sub_pp: int, groupings: tuple[int, ...],
                state_bytes: int, rep: int) -> int:
    """The largest per-GPU peak of a primitive of one block (:meth:`peak_bytes`)."""
    lay = Layout(tp, pp)
    sb = shard_bytes(state_bytes, lay, rep)
    if kind == DESTROY:
        return sb
    if kind == EXTEND:
        return 2 * sb
    sub = Layout(sub_tp, sub_pp)
    if kind == SPLIT:
        return sb + shard_bytes(state_bytes, sub, rep)
    base = shard_bytes(state_bytes, sub, rep)
    return max(base + int(_received(tp, pp, sub_tp, sub_pp, g, state_bytes, rep).max())
               for g in groupings)


@lru_cache(maxsize=4096)
def _received(tp: int, pp: int, sub_tp: int, sub_pp: int, grouping: int, state_bytes: int,
              rep: int) -> np.ndarray:
    _, fb, nb = flow_template(MERGE, tp, pp, sub_tp, sub_pp, grouping, state_bytes, rep)
    out = np.bincount(fb, weights=nb, minlength=tp * pp).astype(np.int64)
    out.flags.writeable = False
    return out


def peak_top(loc: LocalArrays, state_bytes: int, rep: int) -> int:
    """The largest per-GPU peak of any primitive of ``loc``."""
    top = 0
    for blk in loc.blocks:
        sub = blk.sub or blk.lay
        if blk.kind == MERGE and blk.contiguous:
            assert blk.grouping is not None
            groupings: tuple[int, ...] = tuple(
                g for g in (INTERLEAVED, CONTIGUOUS) if np.count_nonzero(blk.grouping == g))
        else:
            groupings = (INTERLEAVED,)
        top = max(top, _block_peak(blk.kind, blk.lay.tp, blk.lay.pp, sub.tp, sub.pp, groupings,
                                   state_bytes, rep))
    return top


def stage_levels(loc: LocalArrays, state_bytes: int, rep: int, in_place: np.ndarray,
                 lay_in_place: Layout, size: int) -> np.ndarray:
    """Per GPU the most bytes the model-stage holds there during its local DAG."""
    lv = np.zeros(size, dtype=np.int64)

    def raise_to(rows: np.ndarray, value: int | np.ndarray) -> None:
        lv[rows] = np.maximum(lv[rows], value)

    for blk in loc.blocks:
        if not blk.count:
            continue
        sb = shard_bytes(state_bytes, blk.lay, rep)
        if blk.kind == DESTROY:
            raise_to(blk.rows, sb)
        elif blk.kind == EXTEND:
            assert blk.new is not None
            raise_to(blk.rows, 2 * sb)
            raise_to(blk.new, sb)
        elif blk.kind == SPLIT:
            assert blk.sub is not None
            raise_to(blk.rows, sb + shard_bytes(state_bytes, blk.sub, rep))
        else:
            assert blk.sub is not None and blk.grouping is not None
            base = shard_bytes(state_bytes, blk.sub, rep)
            for g in (INTERLEAVED, CONTIGUOUS):
                sel = blk.grouping == g
                if sel.any():
                    raise_to(blk.rows[sel], base + merge_received(blk, state_bytes, rep, g))
    if in_place.size:
        raise_to(in_place, shard_bytes(state_bytes, lay_in_place, rep))
    return lv


def excess(levels: dict[str, np.ndarray], excl: Exclusion, capacity_bytes: int) -> np.ndarray:
    """GPUs (ascending) where the co-resident bound of :func:`residency.excess_gpus` exceeds
    ``capacity_bytes``."""
    size = next(iter(levels.values())).shape[0]
    mat = np.zeros((len(excl.names), size), dtype=np.int64)
    for m, lv in levels.items():
        mat[excl.index[m]] = lv
    best = (excl.sets_matrix @ mat).max(0)
    return np.flatnonzero(best > capacity_bytes)


def fits_beside(m: str, lv: np.ndarray, floors: dict[str, np.ndarray], excl: Exclusion,
                capacity_bytes: int) -> bool:
    """``lv`` of ``m`` beside what its co-residents keep throughout fits every GPU."""
    held = lv > 0
    levels = {m: lv}
    for c, fl in floors.items():
        if c != m and not excl.exclusive(m, c):
            levels[c] = np.where(held, fl, 0)
    return not excess(levels, excl, capacity_bytes).size
