"""Model specs for the shard-rule tests (pure/test_emu_shards.py, ranks/test_emu_shards_megatron.py)."""

from __future__ import annotations

import numpy as np

from nereus.emu.shards import tensor_specs
from nereus.spec.model import TINY_GPT, ModelSpec

# A second tiny architecture covering the other branches: MHA with 4 groups (tp up to 4),
# LayerNorm (with biases), qk-norm, non-gated MLP.
TINY_LN = ModelSpec(
    name="tiny-ln", num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=8,
    num_kv_heads=4, vocab_size=128, gated_mlp=False, qk_norm=True, norm="layernorm",
    learned_positions=True, max_seq_len=64,
)
SPECS = {"tiny-gpt": TINY_GPT, "tiny-ln": TINY_LN}


def global_state(seed: int, spec: ModelSpec = TINY_GPT) -> dict[str, dict[str, np.ndarray]]:
    """Random parameters and Adam moments of every tensor of ``spec`` (small, distinct)."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, np.ndarray]] = {"param": {}, "exp_avg": {}, "exp_avg_sq": {}}
    for t in tensor_specs(spec):
        out["param"][t.name] = rng.standard_normal(t.global_shape).astype(np.float32) * 0.05
        out["exp_avg"][t.name] = rng.standard_normal(t.global_shape).astype(np.float32) * 1e-3
        out["exp_avg_sq"][t.name] = rng.random(t.global_shape).astype(np.float32) * 1e-5
    return out
