"""Shard rules (pure) against the metadata of real Megatron-core GPTModels at several layouts,
built on 4 gloo ranks."""

from __future__ import annotations

from typing import Any

import pytest
from support.shard_cases import SPECS

from nereus.emu.boxes import Box
from nereus.emu.shards import shards_at, tensor_specs
from nereus.emu.unit import Emu, Layout

# ---- real Megatron metadata (4 gloo ranks, several layouts on one spawn) ----

# (1, 3) over 4 layers: Megatron's uneven split (1, 2, 1 layers; issue 37), built by
# build_gpt and read back through Megatron's own metadata
LAYOUTS = [("tiny-gpt", Layout(1, 1)), ("tiny-gpt", Layout(2, 1)), ("tiny-gpt", Layout(1, 2)),
           ("tiny-gpt", Layout(2, 2)), ("tiny-ln", Layout(4, 1)), ("tiny-ln", Layout(2, 2)),
           ("tiny-gpt", Layout(1, 3)), ("tiny-ln", Layout(1, 3))]


def _units(layout: Layout, world: int) -> list[Emu]:
    n = world // layout.size
    return [Emu("m", "s", layout, tuple(range(i * layout.size, (i + 1) * layout.size)))
            for i in range(n)]


def _megatron_metadata(rank: int, world: int, store: Any) -> list[Any]:
    from support.megatron_meta import megatron_parts

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
    from support.gloo_harness import shared_pool

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
    uneven = [(pp_rank, rows) for per_rank in results
              for name, layout, pp_rank, _, rows in per_rank
              if name == "tiny-gpt" and layout == Layout(1, 3)]
    layers = {pp_rank: {g.split(".")[2] for g, *_ in rows if g.startswith("decoder.layers.")}
              for pp_rank, rows in uneven}
    assert layers == {0: {"0"}, 1: {"1", "2"}, 2: {"3"}}, layers  # Megatron built 1, 2, 1
