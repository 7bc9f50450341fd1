"""Shard rules (pure): every tensor tiled once, gate/up boxes, layout checks. Against the metadata of
real Megatron-core GPTModels on gloo ranks: ranks/test_emu_shards_megatron.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.shard_cases import SPECS

from nereus.emu.boxes import Box
from nereus.emu.shards import (
    GATE_UP,
    check_layout,
    shards_at,
    stage_layers,
    tensor_specs,
)
from nereus.emu.unit import Layout
from nereus.errors import ConfigError
from nereus.spec.model import TINY_GPT, ModelSpec, stage_layer_counts


def _coverage(spec: ModelSpec, layout: Layout) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in range(layout.pp):
        for t in range(layout.tp):
            for s in shards_at(spec, layout, p, t):
                if not s.tp_replica:
                    counts[s.tensor] = counts.get(s.tensor, 0) + sum(
                        pc.global_.volume for pc in s.pieces)
    return counts


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(sorted(SPECS)), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]))
def test_non_replica_shards_tile_every_tensor_once(name: str, tp: int, pp: int) -> None:
    spec = SPECS[name]
    layout = Layout(tp, pp)
    try:
        check_layout(spec, layout)
    except ConfigError:
        assert spec.num_kv_heads % tp != 0
        return
    counts = _coverage(spec, layout)
    for t in tensor_specs(spec):
        assert counts[t.name] == Box.of_shape(t.global_shape).volume, t.name
    for p in range(pp):
        for tp_rank in range(tp):
            for s in shards_at(spec, layout, p, tp_rank):
                assert sum(pc.local.volume for pc in s.pieces) == Box.of_shape(s.local_shape).volume
    assert [list(stage_layers(spec, pp, p)) for p in range(pp)] == [
        list(range(p * spec.num_layers // pp, (p + 1) * spec.num_layers // pp)) for p in range(pp)]


def test_gate_up_is_two_boxes_per_rank() -> None:
    fc1 = [s for s in shards_at(TINY_GPT, Layout(2, 1), 0, 1) if s.tensor.endswith("linear_fc1.weight")]
    kinds = {t.name: t.kind for t in tensor_specs(TINY_GPT)}
    assert kinds[fc1[0].tensor] == GATE_UP
    gate, up = fc1[0].pieces
    assert (gate.global_.start[0], gate.global_.stop[0]) == (128, 256)
    assert (up.global_.start[0], up.global_.stop[0]) == (256 + 128, 512)


def test_bad_layout_is_config_error() -> None:
    with pytest.raises(ConfigError):
        check_layout(TINY_GPT, Layout(4, 1))
    check_layout(TINY_GPT, Layout(1, 3))  # Megatron's uneven split: 1, 2, 1 layers
    with pytest.raises(ConfigError) as exc:
        check_layout(TINY_GPT, Layout(1, 5))  # more stages than layers
    assert exc.value.field == "layout.pp"


@pytest.mark.parametrize("pp", [3])
def test_uneven_pipeline_shards_follow_megatron_split(pp: int) -> None:
    """pp = 3 over 4 layers: stages of 1, 2, 1 layers (middle ⌈L/pp⌉, the first and last share
    the rest); every tensor is still held exactly once."""
    spec = TINY_GPT
    layout = Layout(2, pp)
    counts = _coverage(spec, layout)
    for t in tensor_specs(spec):
        assert counts[t.name] == Box.of_shape(t.global_shape).volume, t.name
    ranges = [list(stage_layers(spec, pp, p)) for p in range(pp)]
    assert [len(r) for r in ranges] == list(stage_layer_counts(spec.num_layers, pp)) == [1, 2, 1]
    assert [layer for r in ranges for layer in r] == list(range(spec.num_layers))
