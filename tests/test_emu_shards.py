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
from nereus.spec.model import TINY_GPT, ModelSpec

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
        check_layout(TINY_GPT, Layout(1, 3))


# ---- real Megatron metadata (4 gloo ranks, several layouts on one spawn) ----

LAYOUTS = [("tiny-gpt", Layout(1, 1)), ("tiny-gpt", Layout(2, 1)), ("tiny-gpt", Layout(1, 2)),
           ("tiny-gpt", Layout(2, 2)), ("tiny-ln", Layout(4, 1)), ("tiny-ln", Layout(2, 2))]


def _units(layout: Layout, world: int) -> list[Emu]:
    n = world // layout.size
    return [Emu("m", "s", layout, tuple(range(i * layout.size, (i + 1) * layout.size)))
            for i in range(n)]


def _megatron_metadata(rank: int, world: int, store: Any) -> list[Any]:
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    from nereus.engines.megatron_model import build_gpt
    from nereus.runtime.groups import unit_groups

    out: list[Any] = []
    for name, layout in LAYOUTS:
        spec = SPECS[name]
        for emu in _units(layout, world):
            groups = unit_groups(emu, rank, 60.0)
            if groups is None:
                continue
            pos = emu.gpus.index(rank)
            pp_rank, tp_rank = divmod(pos, layout.tp)
            model = build_gpt(spec, layout.tp, layout.pp, pp_rank, groups)
            local = model.state_dict()
            sd = model.sharded_state_dict(metadata={"dp_cp_group": groups.solo})
            rows = []
            for key, item in sd.items():
                if isinstance(item, ShardedTensorFactory):
                    parts = item.build()
                elif isinstance(item, ShardedTensor):
                    parts = [item]
                else:
                    continue
                pieces = []
                row0 = 0
                for sh in parts:
                    k = sh.prepend_axis_num
                    # Our logical name: the local key with the global layer index (Megatron's
                    # checkpoint key may differ, e.g. input_layernorm → linear_qkv.layer_norm_*).
                    gname = key
                    if k:
                        local_layer = key.split(".")[2]
                        gname = key.replace(f"decoder.layers.{local_layer}.",
                                            f"decoder.layers.{sh.global_offset[0]}.", 1)
                    lshape = tuple(sh.local_shape)  # excludes the prepended layer axis
                    if not lshape:
                        raise AssertionError(f"0-d sharded tensor {key}: {sh}")
                    gstart = tuple(sh.global_offset[k:])
                    lstart = (row0,) + (0,) * (len(lshape) - 1)
                    pieces.append((
                        lstart, tuple(a + b for a, b in zip(lstart, lshape, strict=True)),
                        gstart, tuple(a + b for a, b in zip(gstart, lshape, strict=True)),
                        tuple(sh.global_shape[k:]), sh.global_shape[0] if k else None,
                    ))
                    row0 += lshape[0]
                replica = any(int(r) != 0 for r in (parts[0].replica_id if isinstance(
                    parts[0].replica_id, tuple) else (parts[0].replica_id,)))
                rows.append((gname, key, tuple(local[key].shape), tuple(pieces), replica))
            out.append((name, layout, pp_rank, tp_rank, rows))
    return out


@pytest.mark.slow
def test_rules_match_megatron_sharded_state_dict() -> None:
    from gloo_harness import run_ranks

    results = run_ranks(_megatron_metadata, 4)
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
                for ours_piece, (ls, le, gs, ge, gshape, nlayers) in zip(s.pieces, pieces,
                                                                       strict=True):
                    assert ours_piece.local == Box(ls, le), key
                    assert ours_piece.global_ == Box(gs, ge), key
                    assert globals_[gname].global_shape == gshape
                    assert nlayers in (None, spec.num_layers)
                seen += 1
    assert seen > 100
