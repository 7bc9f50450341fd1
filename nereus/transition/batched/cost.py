"""L̂_tran of a batched DAG: the durations of :mod:`cost` a block at a time, then the critical path
level by level (the same floating-point operations in the same order, so the same result).

A Split or Merge the compiler builds always has the canonical sub-units of its grouping, so its
flows are one template over unit positions (:func:`flow_template`) mapped onto each row's GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from nereus.cost.calibration import Calibration
from nereus.emu.primitives import Merge, Split, shard_bytes
from nereus.emu.regions import groupings_differ, sub_units
from nereus.emu.unit import Emu, Layout
from nereus.spec.hardware import ClusterSpec
from nereus.transition.batched.blocks import (
    CONTIGUOUS,
    DESTROY,
    EXTEND,
    INTERLEAVED,
    SPLIT,
    Block,
    row_all,
    row_any,
)
from nereus.transition.cost import rates

_GROUPING = ("interleaved", "contiguous")


@lru_cache(maxsize=4096)
def flow_template(kind: int, tp: int, pp: int, sub_tp: int, sub_pp: int, grouping: int,
                  state_bytes: int, rep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source position, destination position, bytes) of the flows of a Split of a (tp, pp) unit
    into (sub_tp, sub_pp) parts, or of a Merge of such parts into it, in the record's order."""
    lay, sub = Layout(tp, pp), Layout(sub_tp, sub_pp)
    unit = Emu("t", "t", lay, tuple(range(lay.size)))
    parts = sub_units(unit, sub, _GROUPING[grouping])
    p: Split | Merge
    if kind == SPLIT:
        p = Split(unit, parts, state_bytes, _GROUPING[grouping], rep)
    else:
        p = Merge(parts, unit, state_bytes, _GROUPING[grouping], rep)
    flows = p.flows
    out = (np.array([f[0] for f in flows], dtype=np.int64),
           np.array([f[1] for f in flows], dtype=np.int64),
           np.array([f[2] for f in flows], dtype=np.int64))
    for arr in out:
        arr.flags.writeable = False
    return out


def _busiest(rows: np.ndarray, tpl: tuple[np.ndarray, np.ndarray, np.ndarray],
             nodes: np.ndarray, intra: float, inter: float) -> np.ndarray:
    """Per row: the most seconds one GPU spends sending or receiving (``cost._busiest_s``:
    per GPU the flows' seconds added in flow order)."""
    fa, fb, nb = tpl
    k, size = rows.shape
    if not fa.size:
        return np.zeros(k)
    t = (nb / np.where(nodes.take(fa, axis=1) == nodes.take(fb, axis=1), intra, inter)).reshape(-1)
    base = (np.arange(k) * size)[:, None]
    send = np.bincount((base + fa).reshape(-1), weights=t, minlength=k * size)
    recv = np.bincount((base + fb).reshape(-1), weights=t, minlength=k * size)
    out: np.ndarray = np.maximum(send.reshape(k, size).max(1), recv.reshape(k, size).max(1))
    return np.maximum(out, 0.0)


@lru_cache(maxsize=4096)
def _one_node_s(kind: int, tp: int, pp: int, sub_tp: int, sub_pp: int, grouping: int,
                state_bytes: int, rep: int, intra: float, setup_s: float) -> float:
    """Seconds of a Split or Merge whose GPUs share one node (every flow intra-node)."""
    tpl = flow_template(kind, tp, pp, sub_tp, sub_pp, grouping, state_bytes, rep)
    rows = np.arange(tp * pp)[None, :]
    return float(setup_s + _busiest(rows, tpl, np.zeros_like(rows), intra, intra)[0])


def block_durations(blk: Block, state_bytes: int, rep: int, gpn: int, intra: float,
                    inter: float, setup_s: float, out: np.ndarray) -> None:
    """Seconds per primitive of ``blk`` (``cost._duration_s``), written into ``out``."""
    lay = blk.lay
    nodes = blk.rows // gpn
    if blk.kind == EXTEND:
        assert blk.new is not None
        sb = shard_bytes(state_bytes, lay, rep)
        apart = nodes != blk.new // gpn
        if not np.count_nonzero(apart):
            out.fill(setup_s + sb / intra)
        else:
            out[:] = setup_s + sb / np.where(row_any(apart), inter, intra)
        return
    sub = blk.sub
    assert sub is not None and blk.grouping is not None
    one_all = not np.count_nonzero(nodes != nodes[:, :1])
    one = None if one_all else row_all(nodes == nodes[:, :1])
    for g in (INTERLEAVED, CONTIGUOUS) if blk.contiguous else (INTERLEAVED,):
        sel = None if not blk.contiguous else blk.grouping == g
        here = sel if one_all else one if sel is None else sel & one
        if here is None or np.count_nonzero(here):
            if blk.kind == SPLIT and not rep and (g == INTERLEAVED or not groupings_differ(lay, sub)):
                # position-wise all-gather inside a node: (k - 1) shards in and out per GPU
                parts = lay.size // sub.size
                value = setup_s + (parts - 1) * round(state_bytes / lay.size) / intra
            else:
                value = _one_node_s(blk.kind, lay.tp, lay.pp, sub.tp, sub.pp, g, state_bytes, rep,
                                    intra, setup_s)
            if here is None:
                out.fill(value)
            else:
                out[here] = value
        if one_all:
            continue
        assert one is not None
        spread = ~one if sel is None else sel & ~one
        if np.count_nonzero(spread):
            tpl = flow_template(blk.kind, lay.tp, lay.pp, sub.tp, sub.pp, g, state_bytes, rep)
            out[spread] = setup_s + _busiest(blk.rows.compress(spread, axis=0), tpl,
                                             nodes.compress(spread, axis=0), intra, inter)


def durations(blocks: Sequence[tuple[int, Block, int, int]], n: int, cluster: ClusterSpec,
              calib: Calibration | None = None) -> np.ndarray:
    """Seconds per primitive; ``blocks`` holds (offset, block, state bytes, replicated bytes)."""
    r = rates(cluster, calib)
    gpn, intra, inter, setup_s = r.gpus_per_node, r.intra_bps, r.inter_bps, r.primitive_s
    out = np.zeros(n)
    for off, blk, sb, rep in blocks:
        if blk.kind != DESTROY:
            lo = off + blk.start
            block_durations(blk, sb, rep, gpn, intra, inter, setup_s,
                            out[lo:lo + blk.rows.shape[0]])
    return out
