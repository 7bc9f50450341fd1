"""L̂_tran of a batched DAG: the durations of :mod:`cost` a block at a time, then the critical path
level by level (the same floating-point operations in the same order, so the same result).

A Split or Merge the compiler builds always has the canonical sub-units of its grouping, so its
flows are one template over unit positions (:func:`flow_template`) mapped onto each row's GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from nereus.emu.unit import Emu, Layout
from nereus.spec.hardware import ClusterSpec
from nereus.transition.fast_local import CONTIGUOUS, DESTROY, EXTEND, INTERLEAVED, SPLIT, Block
from nereus.transition.primitives import Merge, Split, shard_bytes
from nereus.transition.regions import groupings_differ, sub_units

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


def _busiest(rows: np.ndarray, tpl: tuple[np.ndarray, np.ndarray, np.ndarray], gpn: int,
             intra: float, inter: float) -> np.ndarray:
    """Per row: the most seconds one GPU spends sending or receiving (as ``cost._busiest_s``)."""
    fa, fb, nb = tpl
    k, size = rows.shape
    if not fa.size:
        return np.zeros(k)
    src, dst = rows[:, fa], rows[:, fb]
    t = nb / np.where(src // gpn == dst // gpn, intra, inter)
    base = (np.arange(k) * size)[:, None]
    send = np.zeros(k * size)
    recv = np.zeros(k * size)
    np.add.at(send, (base + fa).reshape(-1), t.reshape(-1))
    np.add.at(recv, (base + fb).reshape(-1), t.reshape(-1))
    out: np.ndarray = np.maximum(send.reshape(k, size).max(1), recv.reshape(k, size).max(1))
    return np.maximum(out, 0.0)


def block_durations(blk: Block, state_bytes: int, rep: int, gpn: int, intra: float,
                    inter: float, setup_s: float) -> np.ndarray:
    """Seconds per primitive of ``blk`` (``cost._duration_s``)."""
    k = blk.count
    if blk.kind == DESTROY:
        return np.zeros(k)
    lay = blk.lay
    if blk.kind == EXTEND:
        assert blk.new is not None
        sb = shard_bytes(state_bytes, lay, rep)
        cross = (blk.rows // gpn != blk.new // gpn).any(1)
        return setup_s + sb / np.where(cross, inter, intra)
    sub = blk.sub
    assert sub is not None and blk.grouping is not None
    out = np.empty(k)
    done = np.zeros(k, dtype=bool)
    if blk.kind == SPLIT and not rep:
        nodes = blk.rows // gpn
        one = nodes.min(1) == nodes.max(1)
        if groupings_differ(lay, sub):
            one &= blk.grouping == INTERLEAVED
        if one.any():
            parts = lay.size // sub.size
            out[one] = setup_s + (parts - 1) * round(state_bytes / lay.size) / intra
            done = one
    for g in (INTERLEAVED, CONTIGUOUS):
        sel = (blk.grouping == g) & ~done
        if sel.any():
            tpl = flow_template(blk.kind, lay.tp, lay.pp, sub.tp, sub.pp, g, state_bytes, rep)
            rows = blk.rows if sel.all() else blk.rows[sel]
            out[sel] = setup_s + _busiest(rows, tpl, gpn, intra, inter)
    return out


def durations(blocks: Sequence[tuple[int, Block, int, int]], n: int, cluster: ClusterSpec
              ) -> np.ndarray:
    """Seconds per primitive; ``blocks`` holds (offset, block, state bytes, replicated bytes)."""
    gpu = cluster.gpu
    gpn, intra, inter = cluster.gpus_per_node, gpu.intra_node_gbps * 1e9, gpu.inter_node_gbps * 1e9
    out = np.zeros(n)
    for off, blk, sb, rep in blocks:
        if blk.kind != DESTROY and blk.count:
            lo = off + blk.start
            out[lo:lo + blk.count] = block_durations(blk, sb, rep, gpn, intra, inter,
                                                     gpu.comm_setup_s)
    return out
