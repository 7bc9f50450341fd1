"""Small Llama / Qwen3 / tied-embedding model specs and their random global weights, for the
Megatron → Hugging Face conversion tests (pure/test_engines_backend.py,
ranks/test_engines_hf_logits.py)."""

from __future__ import annotations

import numpy as np

from nereus.emu.shards import tensor_specs
from nereus.spec.model import ModelSpec

TINY_LLAMA = ModelSpec(name="tiny-llama", num_layers=2, hidden_size=64, ffn_hidden_size=128,
                       num_attention_heads=4, num_kv_heads=2, vocab_size=96, max_seq_len=64)
TINY_QWEN3 = ModelSpec(name="tiny-qwen3", num_layers=2, hidden_size=64, ffn_hidden_size=96,
                       num_attention_heads=8, num_kv_heads=2, head_dim=16, vocab_size=96,
                       qk_norm=True, max_seq_len=64)
TINY_TIED = ModelSpec(name="tiny-tied", num_layers=1, hidden_size=32, ffn_hidden_size=64,
                      num_attention_heads=4, num_kv_heads=4, vocab_size=40,
                      tie_embeddings=True, max_seq_len=32)


def global_weights(spec: ModelSpec, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for t in tensor_specs(spec):
        a = rng.standard_normal(t.global_shape).astype(np.float32)
        out[t.name] = 1.0 + 0.3 * a if "layernorm" in t.name else 0.15 * a
    return out
