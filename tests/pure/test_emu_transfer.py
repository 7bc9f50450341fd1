"""Box and transfer-plan math (pure): exact-once coverage, correct values, minimal bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.emu.boxes import Box, intersect, subtract_all
from nereus.emu.primitives import check_destroy, merge_node, split_node
from nereus.emu.shards import tensor_specs
from nereus.emu.transfer import (
    TransferPlan,
    node_transfer,
    plan_transfer,
    unit_shards,
    weight_sync_plan,
)
from nereus.emu.unit import Emu, Layout
from nereus.errors import TransitionError
from nereus.spec.model import TINY_GPT, ModelSpec

SPEC = ModelSpec(
    name="tiny-4kv", num_layers=4, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4,
    num_kv_heads=4, vocab_size=32, learned_positions=True, max_seq_len=16,
)
LAYOUTS = [Layout(tp, pp) for tp in (1, 2, 4) for pp in (1, 2, 4)]


@st.composite
def boxes(draw: st.DrawFn, ndim: int = 2) -> Box:
    start, stop = [], []
    for _ in range(ndim):
        a = draw(st.integers(0, 8))
        b = draw(st.integers(a, 10))
        start.append(a)
        stop.append(b)
    return Box(tuple(start), tuple(stop))


@settings(max_examples=200, deadline=None)
@given(boxes(), st.lists(boxes(), max_size=4))
def test_subtract_all_partitions_the_rest(a: Box, holes: list[Box]) -> None:
    grid = np.zeros((10, 10), dtype=int)
    for part in subtract_all(a, tuple(holes)):
        grid[part.start[0]:part.stop[0], part.start[1]:part.stop[1]] += 1
    want = np.zeros((10, 10), dtype=int)
    want[a.start[0]:a.stop[0], a.start[1]:a.stop[1]] = 1
    for h in holes:
        common = intersect(a, h)
        if common is not None:
            want[common.start[0]:common.stop[0], common.start[1]:common.stop[1]] = 0
    assert (grid == want).all()


def _global_state(spec: ModelSpec, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.global_shape).astype(np.float32)
            for t in tensor_specs(spec)}


def _local_state(spec: ModelSpec, emu: Emu, glob: dict[str, np.ndarray]
                 ) -> dict[tuple[int, str], np.ndarray]:
    """What the shard rules say each GPU of ``emu`` holds: (gpu, local key) → array."""
    out: dict[tuple[int, str], np.ndarray] = {}
    for gpu, shard in unit_shards(spec, emu):
        arr = np.full(shard.local_shape, np.nan, dtype=np.float32)
        for pc in shard.pieces:
            arr[tuple(slice(a, b) for a, b in zip(pc.local.start, pc.local.stop, strict=True))] = \
                glob[shard.tensor][tuple(slice(a, b) for a, b in
                                         zip(pc.global_.start, pc.global_.stop, strict=True))]
        out[(gpu, shard.local_key)] = arr
    return out


def _sl(b: Box) -> tuple[slice, ...]:
    return tuple(slice(x, y) for x, y in zip(b.start, b.stop, strict=True))


def _check_plan(spec: ModelSpec, plan: TransferPlan, seed: int = 0) -> None:
    """Executing the plan on numpy arrays gives every target exactly its rule shards, each
    destination element written once; bytes_moved never below bytes_min."""
    glob = _global_state(spec, seed)
    src = [_local_state(spec, e, glob) for e in plan.sources]
    for unit, emu in enumerate(plan.targets):
        want = _local_state(spec, emu, glob)
        got = {k: np.full_like(v, np.nan) for k, v in want.items()}
        count = {k: np.zeros(v.shape, dtype=int) for k, v in want.items()}
        for m in plan.moves:
            if m.dst_unit != unit:
                continue
            key = (m.dst_gpu, m.dst_key)
            got[key][_sl(m.dst_box)] = src[m.src_unit][(m.src_gpu, m.src_key)][_sl(m.src_box)]
            count[key][_sl(m.dst_box)] += 1
        for k in want:
            assert (count[k] == 1).all(), k
            assert np.array_equal(got[k], want[k]), k
    assert plan.bytes_moved >= plan.bytes_min


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS), st.integers(0, 4))
def test_split_then_merge(big: Layout, small: Layout, base: int) -> None:
    if not small.divides(big):
        return
    emu = Emu("actor-train", "s", big, tuple(range(base, base + big.size)))
    s = split_node(emu, small)
    sp = node_transfer(SPEC, s, gpus_per_node=64)
    _check_plan(SPEC, sp)
    assert sp.bytes_moved == sp.bytes_min
    # The position-wise all-gather: every non-local move stays inside its block.
    block_of = {g: i for i, blk in enumerate(s.blocks()) for g in blk}
    assert all(block_of[m.src_gpu] == block_of[m.dst_gpu] for m in sp.moves)
    m = merge_node(s.into, big)
    assert m.into == emu
    mp = node_transfer(SPEC, m, gpus_per_node=4)
    _check_plan(SPEC, mp)
    assert mp.bytes_moved == mp.bytes_min == 0  # every merged shard is already resident


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(LAYOUTS), st.integers(1, 3))
def test_extend_sends_every_byte_once_and_balances(layout: Layout, n_replicas: int) -> None:
    reps = [Emu("m", "s", layout, tuple(range(i * layout.size, (i + 1) * layout.size)))
            for i in range(n_replicas)]
    new = tuple(range(n_replicas * layout.size, (n_replicas + 1) * layout.size))
    result = Emu("m", "s", layout, new)
    x = plan_transfer(SPEC, reps, [result], gpus_per_node=64)  # a new replica from all of them
    _check_plan(SPEC, x)
    total = sum(int(np.prod(s.local_shape)) for _, s in unit_shards(SPEC, result)) * 12
    assert x.bytes_moved == x.bytes_min == total
    if n_replicas > 1:
        assert len({mv.src_unit for mv in x.moves}) > 1  # more than one replica sends


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS), st.integers(0, 8), st.integers(1, 2))
def test_any_reshard_and_weight_sync(a: Layout, b: Layout, offset: int, n_src: int) -> None:
    srcs = [Emu("actor-train", "s", a, tuple(range(i * a.size, (i + 1) * a.size)))
            for i in range(n_src)]
    dst = Emu("actor-gen", "s", b, tuple(range(offset, offset + b.size)))
    plan = plan_transfer(SPEC, srcs, [dst], gpus_per_node=4)
    _check_plan(SPEC, plan, seed=offset)
    assert plan.bytes_moved == plan.bytes_min
    ws = weight_sync_plan(SPEC, srcs, [dst])
    assert ws.fields == 1 and ws.bytes_moved * 3 == plan.bytes_moved


def test_same_node_preferred() -> None:
    # Two replicas: GPUs 0-1 (node 0) and 2-3 (node 1); the new unit on node 1 (GPUs 4,5 with 4
    # per node → node 1) must read only from node-1 sources.
    reps = [Emu("m", "s", Layout(2, 1), (0, 1)), Emu("m", "s", Layout(2, 1), (6, 7))]
    x = plan_transfer(TINY_GPT, reps, [Emu("m", "s", Layout(2, 1), (4, 5))], gpus_per_node=4)
    assert {mv.src_gpu for mv in x.moves} == {6, 7}


def test_destroy_refuses_last_copy() -> None:
    a = Emu("m", "s", Layout(1, 1), (0,))
    b = Emu("m", "s", Layout(1, 1), (1,))
    assert check_destroy(a, [a, b]) == (b,)
    with pytest.raises(TransitionError):
        check_destroy(a, [a])
    with pytest.raises(TransitionError):
        check_destroy(a, [a, Emu("m", "other-state", Layout(1, 1), (1,))])


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(LAYOUTS))
def test_combined_extends_cover_both_targets(layout: Layout) -> None:
    from nereus.emu.transfer import combine_plans

    reps = [Emu("m", "s", layout, tuple(range(i * layout.size, (i + 1) * layout.size)))
            for i in range(2)]
    new = [Emu("m", "s", layout, tuple(range(k * layout.size, (k + 1) * layout.size)))
           for k in (2, 3)]
    x1, x2 = (plan_transfer(SPEC, reps, [n]) for n in new)
    plan = combine_plans([x1, x2])
    assert plan.sources == tuple(reps) and plan.targets == tuple(new)
    _check_plan(SPEC, plan)
    assert plan.bytes_moved == plan.bytes_min == x1.bytes_min + x2.bytes_min
