"""What each rank reads of a Hugging Face checkpoint, and the export plan (pure).

Executing a position's slice reads on numpy arrays (the checkpoint's Hugging Face tensors, from
:func:`nereus.emu.hf_layout.to_hf` of a random global state) must give exactly that position's
Megatron shard, covering it once (no byte twice, none outside); the bytes the reads take are the
shard's bytes. Against the independent whole-tensor mapping (``from_hf``), for every layout
and every head.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from support.hf_cases import TINY_LLAMA, TINY_QWEN3, TINY_TIED, global_weights

from nereus.emu.boxes import Box
from nereus.emu.hf_export import export_plan, hf_parts, index_of
from nereus.emu.hf_layout import hf_shapes, to_hf
from nereus.emu.hf_slices import (
    LM_HEAD,
    NEW_HEAD,
    SCORE,
    VALUE,
    ZERO,
    bytes_of_reads,
    needed_tensors,
    shard_reads,
    value_head_row,
)
from nereus.emu.shards import check_layout, shards_at
from nereus.emu.unit import Layout
from nereus.errors import ConfigError
from nereus.spec.model import LLAMA_3_1_8B, ModelSpec

QWEN2 = replace(TINY_LLAMA, name="tiny-qwen2", qkv_bias=True)
SPECS = [TINY_LLAMA, TINY_QWEN3, TINY_TIED, QWEN2]
LAYOUTS = [Layout(1, 1), Layout(2, 1), Layout(1, 2), Layout(2, 2), Layout(4, 1)]


def _global(spec: ModelSpec) -> dict[str, np.ndarray]:
    glob = global_weights(spec, 7)
    if spec.qkv_bias:
        glob.update({k: v for k, v in global_weights(spec, 8).items() if k.endswith(".bias")})
    return glob


def _execute(spec: ModelSpec, layout: Layout, pp_rank: int, tp_rank: int, head: str,
             hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each local tensor of the position, filled only by its reads (NaN where none wrote)."""
    out: dict[str, np.ndarray] = {}
    covered: dict[str, np.ndarray] = {}
    for s, pc, r in shard_reads(spec, layout, pp_rank, tp_rank, head):
        dst = out.setdefault(s.local_key, np.full(s.local_shape, np.nan, dtype=np.float32))
        hits = covered.setdefault(s.local_key, np.zeros(s.local_shape, dtype=np.int64))
        assert pc.global_.contains(r.target_box)
        local = r.target_box.shift(tuple(a - b for a, b in zip(pc.local.start, pc.global_.start,
                                                               strict=True)))
        sl = tuple(slice(a, b) for a, b in zip(local.start, local.stop, strict=True))
        src = tuple(slice(a, b) for a, b in zip(r.source_box.start, r.source_box.stop,
                                                strict=True))
        if r.source == ZERO:
            dst[sl] = 0.0
        elif r.source == VALUE:
            dst[sl] = value_head_row(spec.hidden_size, 5)[src[1]][None, :]
        else:
            dst[sl] = hf[r.source][src]
        hits[sl] += 1
    for key, hits in covered.items():
        assert (hits == 1).all(), key  # every value written exactly once
    return out


def _shard_of(spec: ModelSpec, layout: Layout, pp_rank: int, tp_rank: int,
              glob: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for s in shards_at(spec, layout, pp_rank, tp_rank):
        local = np.zeros(s.local_shape, dtype=np.float32)
        for pc in s.pieces:
            local[tuple(slice(a, b) for a, b in zip(pc.local.start, pc.local.stop,
                                                    strict=True))] = glob[s.tensor][
                tuple(slice(a, b) for a, b in zip(pc.global_.start, pc.global_.stop,
                                                  strict=True))]
        out[s.local_key] = local
    return out


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_reads_give_each_position_exactly_its_shard(spec: ModelSpec, layout: Layout) -> None:
    try:
        check_layout(spec, layout)
    except ConfigError:
        pytest.skip(f"{spec.name} cannot be laid out as {layout}")
    glob = _global(spec)
    hf = to_hf(spec, glob)
    total = sum(a.size for a in hf.values()) * 2  # bf16
    read = 0
    for pp_rank in range(layout.pp):
        for tp_rank in range(layout.tp):
            got = _execute(spec, layout, pp_rank, tp_rank, LM_HEAD, hf)
            want = _shard_of(spec, layout, pp_rank, tp_rank, glob)
            assert got.keys() == want.keys()
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])
            reads = shard_reads(spec, layout, pp_rank, tp_rank)
            nbytes = bytes_of_reads(reads, dict.fromkeys(hf, 2))
            shard_bytes = sum(int(np.prod(s.local_shape)) * 2
                              for s in shards_at(spec, layout, pp_rank, tp_rank))
            assert nbytes == shard_bytes  # a rank reads its shard's bytes, no more
            read += sum(int(np.prod(s.local_shape)) * 2 for s in shards_at(
                spec, layout, pp_rank, tp_rank) if not s.tp_replica)
    assert read == total  # the unit reads the checkpoint once, replicated norms once per tp


@pytest.mark.parametrize("head", [SCORE, NEW_HEAD])
@pytest.mark.parametrize("layout", [Layout(1, 1), Layout(2, 1), Layout(2, 2)], ids=str)
def test_scalar_heads_fill_row_zero_and_zeros(head: str, layout: Layout) -> None:
    spec = QWEN2
    glob = _global(spec)
    hf = to_hf(spec, glob)
    score = np.random.default_rng(1).standard_normal((1, spec.hidden_size)).astype(np.float32)
    if head == SCORE:
        hf = {k: v for k, v in hf.items() if k != "lm_head.weight"} | {"score.weight": score}
    assert set(needed_tensors(spec, head)) == set(hf) - {"lm_head.weight"}
    row = score[0] if head == SCORE else value_head_row(spec.hidden_size, 5)
    pp_last = layout.pp - 1
    heads = [_execute(spec, layout, pp_last, t, head, hf)["output_layer.weight"]
             for t in range(layout.tp)]
    full = np.concatenate(heads, axis=0)
    np.testing.assert_array_equal(full[0], row)
    assert not full[1:].any()


def test_value_head_is_small_deterministic_and_seeded() -> None:
    a, b = value_head_row(896, 3), value_head_row(896, 3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, value_head_row(896, 4))
    assert abs(float(a.std()) - 1 / 897) < 0.2 / 897


@pytest.mark.parametrize("layout", [Layout(1, 1), Layout(2, 1), Layout(1, 2), Layout(2, 4)],
                         ids=str)
def test_export_plan_writes_every_tensor_once_from_its_stage(layout: Layout) -> None:
    spec = LLAMA_3_1_8B
    files = export_plan(spec, layout, 2, 5_000_000_000)
    names = [n for f in files for n, _ in f.hf]
    assert sorted(names) == sorted(hf_shapes(spec)) and len(names) == len(set(names))
    assert index_of(files)["metadata"] == {"total_size": 2 * spec.num_params()}
    per_writer: dict[tuple[int, int], int] = {}
    for f in files:
        assert f.nbytes <= 5_000_000_000
        per_writer[(f.pp_rank, f.tp_rank)] = per_writer.get((f.pp_rank, f.tp_rank), 0) + f.nbytes
        assert f.name.endswith(f"-of-{len(files):05d}.safetensors")
    assert set(per_writer) == {(p, t) for p in range(layout.pp) for t in range(layout.tp)}
    for p in range(layout.pp):  # a stage's bytes spread over its tp ranks within a tensor
        shares = [per_writer[(p, t)] for t in range(layout.tp)]
        assert max(shares) - min(shares) <= 2 * spec.vocab_size * spec.hidden_size


def test_export_of_a_critic_is_a_score_head_on_tp_rank_zero() -> None:
    spec = replace(QWEN2, tie_embeddings=False)
    assert hf_parts(spec, "output_layer.weight", SCORE) == (
        ("score.weight", (1, spec.hidden_size)), ("score.bias", (1,)))
    files = export_plan(spec, Layout(2, 2), 4, 10**9, SCORE)
    holder = [f for f in files if "output_layer.weight" in f.tensors]
    assert [(f.pp_rank, f.tp_rank) for f in holder] == [(1, 0)]
    assert Box((0,), (1,)).volume == 1
