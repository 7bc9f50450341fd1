"""The per-pair message split of nereus.runtime.execution.pack: contiguity of boxes, partition, padding."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.emu.boxes import Box
from nereus.runtime.execution.pack import (
    DIRECT_MIN_VALUES,
    box_is_contiguous,
    pack,
    pair_messages,
    unpack,
)


@st.composite
def shape_and_box(draw: st.DrawFn) -> tuple[tuple[int, ...], Box]:
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    start, stop = [], []
    for n in shape:
        a = draw(st.integers(0, n - 1))
        start.append(a)
        stop.append(draw(st.integers(a + 1, n)))
    return shape, Box(tuple(start), tuple(stop))


@settings(max_examples=300, deadline=None)
@given(shape_and_box())
def test_box_contiguity_matches_torch_views(case: tuple[tuple[int, ...], Box]) -> None:
    shape, box = case
    t = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    view = t[tuple(slice(a, b) for a, b in zip(box.start, box.stop, strict=True))]
    # torch calls a view contiguous when its elements are one dense C-order range
    flat = view.reshape(-1)
    dense = bool((flat[1:] - flat[:-1] == 1).all()) if flat.numel() > 1 else True
    assert box_is_contiguous(box, shape) == dense == view.is_contiguous()


@given(st.lists(st.tuples(st.integers(1, 3 * DIRECT_MIN_VALUES), st.booleans()), max_size=12))
def test_pair_messages_partition_items_in_order(items: list[tuple[int, bool]]) -> None:
    msgs = pair_messages([n for n, _ in items], [c for _, c in items])
    assert sorted(msgs.direct + msgs.packed) == list(range(len(items)))
    assert list(msgs.direct) == sorted(msgs.direct) and list(msgs.packed) == sorted(msgs.packed)
    for i in msgs.direct:
        assert items[i][1] and items[i][0] >= DIRECT_MIN_VALUES
    for i in msgs.packed:
        assert not items[i][1] or items[i][0] < DIRECT_MIN_VALUES


def test_pack_pads_and_unpack_restores_strided_views() -> None:
    src = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    views = [src[:, 1:3], src[2:, :]]
    buf = pack(views, length=30)
    assert buf.numel() == 30 and bool((buf[20:] == 0).all())
    dst = torch.full((4, 6), -1.0)
    unpack(buf[:20], [dst[:, 1:3], dst[2:, :]])
    assert torch.equal(dst[:, 1:3], src[:, 1:3]) and torch.equal(dst[2:, :], src[2:, :])
    try:
        unpack(buf, [dst[:, 1:3]])
    except ValueError:
        pass
    else:
        raise AssertionError("unpack accepted a buffer longer than its views")
