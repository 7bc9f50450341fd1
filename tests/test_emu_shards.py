"""Shard rules (pure) against the metadata of real Megatron-core GPTModels at several layouts."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.emu.boxes import Box
from nereus.emu.shards import (
    GATE_UP,
    check_layout,
    shards_at,
    stage_layers,
    tensor_specs,
)
from nereus.emu.unit import Emu, Layout
from nereus.errors import ConfigError
from nereus.spec.model import TINY_GPT, ModelSpec, stage_layer_counts

# A second tiny architecture covering the other branches: MHA with 4 groups (tp up to 4),
# LayerNorm (with biases), qk-norm, non-gated MLP.
TINY_LN = ModelSpec(
    name="tiny-ln", num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=8,
    num_kv_heads=4, vocab_size=128, gated_mlp=False, qk_norm=True, norm="layernorm",
    learned_positions=True, max_seq_len=64,
)
SPECS = {"tiny-gpt": TINY_GPT, "tiny-ln": TINY_LN}


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
    with pytest.raises(ConfigError):
        check_layout(TINY_GPT, Layout(1, 3))  # the runtime's rule: pp divides the layers
    check_layout(TINY_GPT, Layout(1, 3), uneven_pipeline=True)  # the planner's uneven space
    with pytest.raises(ConfigError):
        check_layout(TINY_GPT, Layout(1, 5), uneven_pipeline=True)  # more stages than layers


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


# ---- real Megatron metadata (4 gloo ranks, several layouts on one spawn) ----

LAYOUTS = [("tiny-gpt", Layout(1, 1)), ("tiny-gpt", Layout(2, 1)), ("tiny-gpt", Layout(1, 2)),
           ("tiny-gpt", Layout(2, 2)), ("tiny-ln", Layout(4, 1)), ("tiny-ln", Layout(2, 2))]


def _units(layout: Layout, world: int) -> list[Emu]:
    n = world // layout.size
    return [Emu("m", "s", layout, tuple(range(i * layout.size, (i + 1) * layout.size)))
            for i in range(n)]


def _megatron_metadata(rank: int, world: int, store: Any) -> list[Any]:
    from megatron_meta import megatron_parts

    from nereus.engines.megatron_model import build_gpt
    from nereus.runtime.execution.groups import unit_groups

    out: list[Any] = []
    for name, layout in LAYOUTS:
        spec = SPECS[name]
        for emu in _units(layout, world):
            groups = unit_groups(emu, rank, 60.0)
            if groups is None:
                continue
            pp_rank, tp_rank = divmod(emu.gpus.index(rank), layout.tp)
            model = build_gpt(spec, layout.tp, layout.pp, pp_rank, groups)
            local = model.state_dict()
            rows = [(gname, key, tuple(local[key].shape), tuple(parts), replica)
                    for key, (gname, parts, replica) in megatron_parts(model, groups.solo).items()]
            out.append((name, layout, pp_rank, tp_rank, rows))
    return out


@pytest.mark.slow
def test_rules_match_megatron_sharded_state_dict() -> None:
    from gloo_harness import shared_pool

    results = shared_pool(4).run(_megatron_metadata)
    seen = 0
    for per_rank in results:
        for name, layout, pp_rank, tp_rank, rows in per_rank:
            spec = SPECS[name]
            globals_ = {t.name: t for t in tensor_specs(spec)}
            ours = {s.local_key: s for s in shards_at(spec, layout, pp_rank, tp_rank)}
            assert set(ours) == {r[1] for r in rows}, (name, layout)
            for gname, key, shape, pieces, replica in rows:
                s = ours[key]
                assert s.tensor == gname
                assert s.local_shape == shape
                assert s.tp_replica == replica, (key, layout, tp_rank)
                assert len(s.pieces) == len(pieces), key
                for ours_piece, (ls, le, gs, ge, nlayers) in zip(s.pieces, pieces, strict=True):
                    assert ours_piece.local == Box(ls, le), key
                    assert ours_piece.global_ == Box(gs, ge), key
                    assert Box.of_shape(globals_[gname].global_shape).contains(Box(gs, ge))
                    assert nlayers in (None, spec.num_layers)
                seen += 1
    assert seen > 100
