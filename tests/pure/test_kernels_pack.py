"""Shard pack/unpack, torch fallback: against torch's own slicing, every byte checked.

Outputs are poisoned twice (all 0x00, all 0xFF bytes: tests/pack_cases.py) so a byte never
written cannot match the reference in both runs; destinations outside the slices keep the poison.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.pack_cases import (
    check_pack,
    check_roundtrip,
    check_unpack,
    random_pieces,
    random_tensor,
    reference_pack,
    tensor_bytes,
)

from nereus.errors import TransitionError
from nereus.kernels.pack import (
    backend,
    pack,
    pack_views,
    slice_spec,
    specs_of_pieces,
    unpack,
    unpack_views,
)
from nereus.kernels.slices import SliceSpec, merged_dims, row_geometry


@settings(max_examples=150, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(0, 15))
def test_pack_matches_reference_slicing(rng: random.Random, shift: int) -> None:
    pieces = random_pieces(rng)
    check_pack(pieces, shift=shift)
    auto = pack(pieces)
    dtypes = {t.dtype for t, _ in pieces}
    assert auto.dtype == (dtypes.pop() if len(dtypes) == 1 else torch.uint8)
    assert torch.equal(tensor_bytes(auto), reference_pack(pieces))


@settings(max_examples=150, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(0, 15))
def test_unpack_writes_exactly_the_slices(rng: random.Random, shift: int) -> None:
    check_unpack(random_pieces(rng, disjoint=True), shift=shift)


@settings(max_examples=100, deadline=None)
@given(st.randoms(use_true_random=False))
def test_unpack_of_pack_is_identity(rng: random.Random) -> None:
    check_roundtrip(random_pieces(rng, disjoint=True))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=5),
    st.data(),
)
def test_row_geometry_enumerates_the_same_bytes(shape, data) -> None:
    """Merged dims and the row geometry visit exactly the slice's bytes, in the same order."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    box = []
    for n in shape:
        a = data.draw(st.integers(0, n - 1))
        box.append((a, data.draw(st.integers(a + 1, n))))
    spec = SliceSpec(0, sum(a * s for (a, _), s in zip(box, strides, strict=True)), tuple(strides),
                     tuple(b - a for a, b in box))
    es = data.draw(st.sampled_from((1, 2, 4)))
    expect = []
    for idx in itertools.product(*(range(n) for n in spec.sizes)):
        e = spec.offset + sum(i * s for i, s in zip(idx, spec.strides, strict=True))
        expect.extend(range(e * es, e * es + es))
    geom = row_geometry(spec, es)
    dims = merged_dims(spec)
    assert len(dims) <= len(shape)
    if geom is None:  # only when more than three outer dims remain
        assert len(dims) > 4 or (len(dims) == 4 and dims[-1][1] != 1)
        return
    got = []
    for i0, i1, i2 in itertools.product(*(range(n) for n in geom.outer_sizes)):
        start = geom.offset_bytes + i0 * geom.outer_strides_bytes[0] + i1 * geom.outer_strides_bytes[1] \
            + i2 * geom.outer_strides_bytes[2]
        got.extend(range(start, start + geom.row_bytes))
    assert got == expect
    assert geom.nbytes == spec.numel * es


def test_contiguous_slices_merge_to_one_row() -> None:
    t = torch.zeros(8, 6, 4)
    spec = slice_spec(0, t, ((2, 5), (0, 6), (0, 4)))
    geom = row_geometry(spec, 4)
    assert geom is not None
    assert (geom.row_bytes, geom.rows) == (3 * 6 * 4 * 4, 1)
    col = row_geometry(slice_spec(0, t, ((0, 8), (1, 3), (0, 4))), 4)
    assert col is not None
    assert (col.row_bytes, col.outer_sizes, col.outer_strides_bytes) == (32, (8, 1, 1), (96, 0, 0))


def test_pack_with_slice_specs_and_mixed_dtypes() -> None:
    a = random_tensor((5, 3), torch.float16, 1)
    b = random_tensor((7,), torch.float32, 2)
    specs = [SliceSpec(0, 1, (3,), (3,)), SliceSpec(1, 2, (1,), (4,)), SliceSpec(0, 0, (3, 1), (2, 2))]
    buf = pack([a, b], specs)
    assert buf.dtype == torch.uint8
    ref = torch.cat([tensor_bytes(a.reshape(-1)[1:10:3]), tensor_bytes(b[2:6]), tensor_bytes(a[0:2, 0:2])])
    assert torch.equal(buf, ref)  # the fp32 slice lands at byte 6: the unaligned byte path
    a2, b2 = torch.zeros_like(a), torch.zeros_like(b)
    unpack(buf, [a2, b2], specs)
    assert torch.equal(tensor_bytes(b2[2:6]), tensor_bytes(b[2:6]))
    assert torch.equal(tensor_bytes(a2[0:2, 0:2]), tensor_bytes(a[0:2, 0:2]))
    assert torch.equal(tensor_bytes(a2.reshape(-1)[1:10:3]), tensor_bytes(a.reshape(-1)[1:10:3]))


def test_pieces_accept_box_objects_and_keep_order() -> None:
    class Box:
        def __init__(self, start, stop):
            self.start, self.stop = start, stop

    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    buf = pack([(t, Box((0, 5), (4, 6))), (t, ((1, 2), (0, 3)))])
    assert buf.tolist() == [5.0, 11.0, 17.0, 23.0, 6.0, 7.0, 8.0]
    tensors, specs = specs_of_pieces([(t, ((1, 3), (2, 4)))])
    assert tensors[0] is t and specs == [SliceSpec(0, 8, (6, 1), (2, 2))]


def test_requires_grad_parameters_pack_and_unpack() -> None:
    p = torch.nn.Parameter(torch.randn(4, 4))
    buf = pack([(p, ((0, 4), (0, 2)))])
    q = torch.nn.Parameter(torch.zeros(4, 4))
    unpack(buf, [(q, ((0, 4), (2, 4)))])
    assert torch.equal(q.detach()[:, 2:], p.detach()[:, :2])
    assert not buf.requires_grad


def test_errors_name_the_problem() -> None:
    t = torch.zeros(4, 4)
    with pytest.raises(TransitionError, match="axis 1"):
        pack([(t, ((0, 4), (0, 5)))])
    with pytest.raises(TransitionError, match="bytes"):
        pack([(t, ((0, 2), (0, 4)))], out=torch.empty(7))
    with pytest.raises(TransitionError, match="contiguous"):
        unpack(torch.zeros(4, 8)[:, ::2], [(t, ((0, 4), (0, 4)))])
    with pytest.raises(TransitionError, match="past the last element"):
        pack([t], [SliceSpec(0, 10, (4, 1), (2, 4))])
    with pytest.raises(TransitionError, match="several devices"):
        pack([(t, ((0, 1), (0, 1))), (torch.zeros(2, device="meta"), ((0, 1),))])
    with pytest.raises(TransitionError, match=r"needs \(tensor, box\)"):
        pack([t])  # tensors without slices
    with pytest.raises(TransitionError, match="not available"):
        pack([(t, ((0, 1), (0, 1)))], force_backend="kernels")
    with pytest.raises(TransitionError, match=">= 0"):
        SliceSpec(0, 0, (-1,), (2,))


def test_cpu_tensors_use_the_torch_fallback() -> None:
    assert backend(torch.device("cpu")) == "torch"
    assert pack([]).numel() == 0
    empty = pack([(torch.zeros(3, 3), ((1, 1), (0, 3)))])
    assert empty.numel() == 0


def test_pack_views_is_the_runtime_hook_signature() -> None:
    w = random_tensor((6, 8), torch.float32, 5)
    views = [w[:, 2:5], w[1:3], w.t()[::2]]
    buf = pack_views(views)
    assert torch.equal(tensor_bytes(buf), torch.cat([tensor_bytes(v) for v in views]))
    dest = torch.zeros(6, 8)
    targets = [dest[:, 2:5], dest[4:6, 5:8]]
    unpack_views(buf[: 6 * 3 + 6], targets)
    assert torch.equal(tensor_bytes(dest[:, 2:5]), tensor_bytes(w[:, 2:5]))
    assert torch.equal(tensor_bytes(dest[4:6, 5:8]), tensor_bytes(w[1:3].reshape(-1)[:6].view(2, 3)))
    assert torch.all(dest[:4, 5:] == 0) and torch.all(dest[:, :2] == 0)
    with pytest.raises(TransitionError, match="bytes"):
        unpack_views(buf, targets)
