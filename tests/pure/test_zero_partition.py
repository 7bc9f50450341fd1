"""The pure ZeRO re-partition math (nereus.emu.zero) against an element-by-element model.

Layouts here are built the way ZeRO stages 1/2 lay out a param group (parameters flattened one
after another with alignment padding, the padded total cut into dp equal partitions) by a
helper of this test only: the runtime reads them from DeepSpeed (tests/ranks/test_deepspeed_zero.py).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from nereus.emu.zero import Fragment, RankPartition, ZeroLayout, layout_of, min_bytes, repartition
from nereus.errors import TransitionError

TENSORS = (("a", 10), ("b", 7), ("c", 33), ("d", 1), ("e", 20))


def _layout(gpus, tensors=TENSORS, align=4):
    offsets, at = {}, 0
    for name, n in tensors:
        offsets[name] = at
        at += n + (-n) % align
    dp = len(gpus)
    size = -(-at // dp)
    parts = []
    for r in range(dp):
        lo, hi = r * size, (r + 1) * size
        frags = []
        for name, n in tensors:
            a, b = max(lo, offsets[name]), min(hi, offsets[name] + n)
            if a < b:
                frags.append(Fragment(name, a - offsets[name], a - lo, b - a))
        parts.append([RankPartition(0, size, tuple(frags))])
    return layout_of(gpus, tensors, parts)


def _owner(layout):
    """(tensor, index) → GPU holding its optimizer state."""
    out = {}
    for gpu, rank_parts in zip(layout.gpus, layout.parts, strict=True):
        for fr in rank_parts[0].fragments:
            for i in range(fr.tensor_start, fr.tensor_stop):
                out[(fr.tensor, i)] = gpu
    return out


CASES = [((0, 1), (0, 1, 2, 3)), ((0, 1, 2, 3), (0, 1)), ((0, 1), (2, 3)),
         ((0, 1, 2), (0, 1, 2, 3, 4)), ((3, 1), (1, 3, 5))]


@pytest.mark.parametrize("src_gpus,dst_gpus", CASES)
def test_every_element_once_from_its_holder(src_gpus, dst_gpus):
    src, dst = _layout(src_gpus), _layout(dst_gpus)
    plan = repartition(src, dst)
    own_src, own_dst = _owner(src), _owner(dst)
    # simulate: each target partition slot receives exactly one value, from the right place
    got = {g: np.full(dst.parts[dst.gpus.index(g)][0].size, -1) for g in dst.gpus}
    src_vals = {}
    for g, rp in zip(src.gpus, src.parts, strict=True):
        arr = np.full(rp[0].size, -2)
        for fr in rp[0].fragments:
            arr[fr.part_start:fr.part_start + fr.numel] = [
                hash((fr.tensor, i)) % 10**9 for i in range(fr.tensor_start, fr.tensor_stop)]
        src_vals[g] = arr
    for m in plan.moves:
        seg = got[m.dst_gpu][m.dst_start:m.dst_start + m.numel]
        assert (seg == -1).all(), "a slot written twice"
        seg[:] = src_vals[m.src_gpu][m.src_start:m.src_start + m.numel]
        assert (seg >= 0).all(), "a move reads padding"
    for g, rp in zip(dst.gpus, dst.parts, strict=True):
        for fr in rp[0].fragments:
            want = [hash((fr.tensor, i)) % 10**9 for i in range(fr.tensor_start, fr.tensor_stop)]
            assert list(got[g][fr.part_start:fr.part_start + fr.numel]) == want
    # minimum: an element moves iff its target GPU did not hold it
    must = sum(1 for k, g in own_dst.items() if own_src[k] != g)
    new = sum(1 for g in dst_gpus if g not in src_gpus)
    total = sum(n for _, n in TENSORS)
    assert min_bytes(src, dst) == must * 2 * 4 + new * total * 4
    assert plan.bytes_moved == plan.bytes_min == min_bytes(src, dst)
    # parameters: each new GPU gets each element once, from its optimizer-state holder
    for g in dst_gpus:
        recv = [(m.tensor, i, m.src_gpu) for m in plan.param_moves if m.dst_gpu == g
                for i in range(m.start, m.start + m.numel)]
        if g in src_gpus:
            assert recv == []
        else:
            assert sorted(recv) == sorted((t, i, own_src[(t, i)]) for t, n in TENSORS
                                          for i in range(n))


def test_survivors_send_nothing_they_keep():
    src, dst = _layout((0, 1, 2, 3)), _layout((0, 1))
    plan = repartition(src, dst)
    assert not plan.param_moves
    assert all(m.dst_gpu in (0, 1) for m in plan.moves)
    assert any(m.is_local for m in plan.moves)


def test_bad_layouts_are_refused():
    good = _layout((0, 1))
    parts = [list(p) for p in good.parts]
    fr = parts[0][0].fragments
    parts[0][0] = RankPartition(0, parts[0][0].size, fr[:-1])  # an element held nowhere
    with pytest.raises(TransitionError, match="held nowhere"):
        layout_of((0, 1), TENSORS, parts)
    with pytest.raises(TransitionError, match="different parameters"):
        repartition(good, _layout((0, 1), TENSORS[:-1]))
    with pytest.raises(TransitionError):
        ZeroLayout((0, 0), TENSORS, good.parts)


def test_moves_are_merged_and_deterministic():
    a = repartition(_layout((0, 1)), _layout((0, 1, 2, 3)))
    b = repartition(_layout((0, 1)), _layout((0, 1, 2, 3)))
    assert a == b
    for x, y in itertools.pairwise(a.moves):
        if (x.group, x.src_gpu, x.dst_gpu) == (y.group, y.src_gpu, y.dst_gpu):
            assert not (x.src_start + x.numel == y.src_start
                        and x.dst_start + x.numel == y.dst_start)
