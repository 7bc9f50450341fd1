"""The Megatron → Hugging Face weight conversion, in this process: round trips bit for bit, the
QKV split follows Megatron's query groups, real architectures' shapes, and what vLLM cannot
load is rejected. The conversion checked against real models' logits (a gloo world of one):
ranks/test_engines_hf_logits.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.hf_cases import TINY_LLAMA, TINY_QWEN3, TINY_TIED, global_weights

from nereus.emu import hf_layout
from nereus.emu.hf_layout import (
    LLAMA,
    QWEN3,
    UnsupportedArchitecture,
    from_hf,
    hf_architecture,
    hf_config,
    hf_shapes,
    to_hf,
)
from nereus.spec.model import LLAMA_3_1_8B, QWEN3_14B, TINY_GPT, ModelSpec


@pytest.mark.parametrize("spec", [TINY_LLAMA, TINY_QWEN3, TINY_TIED], ids=lambda s: s.name)
def test_conversion_round_trips_bit_exact(spec: ModelSpec) -> None:
    glob = global_weights(spec, 0)
    hf = to_hf(spec, glob)
    assert {k: v.shape for k, v in hf.items()} == hf_shapes(spec)
    back = from_hf(spec, hf)
    assert set(back) == set(glob)
    for name, arr in glob.items():
        assert np.array_equal(back[name], arr), name
    assert ("lm_head.weight" in hf) == (not spec.tie_embeddings)


def test_qkv_split_follows_megatron_query_groups() -> None:
    """Rows tagged with (group, slot) land in q heads in order, then k and v per group."""
    spec = TINY_QWEN3  # 8 heads in 2 groups: 4 query heads per group
    d, g, per = spec.kv_channels, spec.num_kv_heads, 4
    tag = np.zeros((g * (per + 2) * d, spec.hidden_size), dtype=np.float32)
    for grp in range(g):
        for slot in range(per + 2):
            tag[(grp * (per + 2) + slot) * d:(grp * (per + 2) + slot + 1) * d] = grp * 10 + slot
    q, k, v = hf_layout.split_qkv(spec, tag)
    assert [int(q[h * d, 0]) for h in range(g * per)] == [0, 1, 2, 3, 10, 11, 12, 13]
    assert [int(k[i * d, 0]) for i in range(g)] == [4, 14]
    assert [int(v[i * d, 0]) for i in range(g)] == [5, 15]


def test_real_architectures_have_the_hf_shapes() -> None:
    shapes = hf_shapes(LLAMA_3_1_8B)
    assert len(shapes) == 1 + 32 * 9 + 2
    assert shapes["model.layers.31.self_attn.q_proj.weight"] == (4096, 4096)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (1024, 4096)
    assert shapes["model.layers.0.mlp.gate_proj.weight"] == (14336, 4096)
    assert shapes["lm_head.weight"] == (128256, 4096)
    assert hf_architecture(LLAMA_3_1_8B) == LLAMA and hf_architecture(QWEN3_14B) == QWEN3
    qwen = hf_shapes(QWEN3_14B)
    assert qwen["model.layers.0.self_attn.q_proj.weight"] == (5120, 5120)  # 40 heads × 128
    assert qwen["model.layers.0.self_attn.q_norm.weight"] == (128,)
    cfg = hf_config(QWEN3_14B, eos_token_id=1, pad_token_id=0, bos_token_id=1)
    assert cfg["architectures"] == [QWEN3] and cfg["head_dim"] == 128


@pytest.mark.parametrize(("change", "fragment"), [
    ({"learned_positions": True}, "learned absolute position embeddings"),
    ({"norm": "layernorm"}, "norm='layernorm'"),
    ({"gated_mlp": False}, "non-gated MLP"),
])
def test_architectures_vllm_cannot_load_are_rejected(change: dict[str, Any],
                                                      fragment: str) -> None:
    spec = ModelSpec(**{**vars(TINY_LLAMA), **change})
    with pytest.raises(UnsupportedArchitecture, match=fragment) as e:
        to_hf(spec, {})
    assert "\n" not in str(e.value) and "vLLM" in str(e.value)
    with pytest.raises(UnsupportedArchitecture):
        hf_architecture(TINY_GPT)  # the runtime's CPU models use learned positions


def test_unknown_or_misshapen_tensors_are_rejected() -> None:
    glob = global_weights(TINY_LLAMA, 1)
    with pytest.raises(UnsupportedArchitecture, match="not a tensor"):
        to_hf(TINY_LLAMA, {**glob, "decoder.layers.9.mlp.linear_fc2.weight": glob[
            "decoder.layers.0.mlp.linear_fc2.weight"]})
    with pytest.raises(UnsupportedArchitecture, match="has shape"):
        to_hf(TINY_LLAMA, {"output_layer.weight": np.zeros((3, 3), dtype=np.float32)})
    hf = to_hf(TINY_LLAMA, glob)
    del hf["model.norm.weight"]
    with pytest.raises(UnsupportedArchitecture, match="missing"):
        from_hf(TINY_LLAMA, hf)
