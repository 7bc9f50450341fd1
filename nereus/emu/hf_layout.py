"""Megatron-core logical state ↔ Hugging Face Llama-family names and tensors (pure).

Nereus holds a model's *global logical state* under Megatron-core parameter names
(``nereus.emu.shards.tensor_specs``). Generation engines outside Megatron — vLLM's
``model.load_weights(iterable of (name, tensor))`` for ``LlamaForCausalLM`` /
``Qwen3ForCausalLM`` — take Hugging Face names and the unfused layout:

======================================================  ==============================================
Megatron-core (global layer index L)                    Hugging Face
======================================================  ==============================================
``embedding.word_embeddings.weight``                    ``model.embed_tokens.weight``
``decoder.layers.L.input_layernorm.weight``             ``model.layers.L.input_layernorm.weight``
``decoder.layers.L.self_attention.linear_qkv.weight``   ``model.layers.L.self_attn.{q,k,v}_proj.weight``
``decoder.layers.L.self_attention.q_layernorm.weight``  ``model.layers.L.self_attn.q_norm.weight`` (Qwen3)
``decoder.layers.L.self_attention.k_layernorm.weight``  ``model.layers.L.self_attn.k_norm.weight`` (Qwen3)
``decoder.layers.L.self_attention.linear_proj.weight``  ``model.layers.L.self_attn.o_proj.weight``
``decoder.layers.L.pre_mlp_layernorm.weight``           ``model.layers.L.post_attention_layernorm.weight``
``decoder.layers.L.mlp.linear_fc1.weight``              ``model.layers.L.mlp.{gate,up}_proj.weight``
``decoder.layers.L.mlp.linear_fc2.weight``              ``model.layers.L.mlp.down_proj.weight``
``decoder.final_layernorm.weight``                      ``model.norm.weight``
``output_layer.weight``                                 ``lm_head.weight`` (absent when tied)
======================================================  ==============================================

The fused QKV rows are Megatron's per-query-group layout: for each of the ``g`` query groups,
its ``heads/g`` query heads, then its key head, then its value head (``kv_channels`` rows each).
Hugging Face's q_proj stacks query heads in order (head i uses kv head ``i // (heads/g)``), so
the split is a reshape to ``[g, heads/g + 2, d, hidden]``. The fused SwiGLU ``linear_fc1`` is
``[gate; up]``. Megatron's RoPE is the non-interleaved (rotate-half) form Hugging Face's Llama
uses, so no per-head permutation is needed (checked against ``transformers`` in
``tests/ranks/test_engines_hf_logits.py``).

Architectures vLLM's Llama path cannot take are rejected with :class:`UnsupportedArchitecture`:
learned absolute positions, LayerNorm (with bias), a non-gated MLP.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from nereus.emu.shards import tensor_specs
from nereus.errors import NereusError
from nereus.spec.model import ModelSpec

LLAMA = "LlamaForCausalLM"
QWEN3 = "Qwen3ForCausalLM"  # Llama plus per-head RMSNorm on q and k (qk_norm)
MEGATRON_ROPE_THETA = 10000.0  # GPTModel's default rotary_base
MEGATRON_NORM_EPS = 1e-5  # TransformerConfig's default layernorm_epsilon


class UnsupportedArchitecture(NereusError):
    """A model the Hugging Face Llama-family layout (and so vLLM's loader) cannot express."""


def hf_architecture(spec: ModelSpec) -> str:
    """``LlamaForCausalLM`` (or ``Qwen3ForCausalLM`` with qk_norm) for ``spec``, else raise."""
    rules = [
        (spec.learned_positions, "learned absolute position embeddings (Llama uses RoPE)"),
        (spec.norm != "rmsnorm", f"norm={spec.norm!r} (Llama uses RMSNorm without bias)"),
        (not spec.gated_mlp, "a non-gated MLP (Llama's MLP is SwiGLU: gate, up, down)"),
    ]
    for bad, what in rules:
        if bad:
            raise UnsupportedArchitecture(
                f"model {spec.name!r} has {what}: vLLM's Llama-family loader cannot take it")
    return QWEN3 if spec.qk_norm else LLAMA


def hf_config(spec: ModelSpec, *, eos_token_id: int, pad_token_id: int, bos_token_id: int,
              torch_dtype: str = "float32", max_position_embeddings: int = 0,
              rope_theta: float = MEGATRON_ROPE_THETA,
              rms_norm_eps: float = MEGATRON_NORM_EPS) -> dict[str, Any]:
    """The ``config.json`` of ``spec`` as a Hugging Face Llama-family model (plain data).

    ``rope_theta`` and ``rms_norm_eps`` must be those the Megatron model was built with (the
    defaults are Megatron's); ``max_position_embeddings`` defaults to ``spec.max_seq_len``."""
    arch = hf_architecture(spec)
    return {
        "architectures": [arch],
        "model_type": "qwen3" if arch == QWEN3 else "llama",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.ffn_hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.kv_channels,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings or spec.max_seq_len,
        "rms_norm_eps": rms_norm_eps,
        "rope_theta": rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": spec.tie_embeddings,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "torch_dtype": torch_dtype,
        "use_cache": True,
    }


def _layer_of(name: str) -> tuple[int, str] | None:
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[0] == "decoder" and parts[1] == "layers":
        return int(parts[2]), parts[3]
    return None


_GLOBAL = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}
_LAYER = {  # Megatron suffix → HF suffix, for the tensors that map one to one
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
QKV = "self_attention.linear_qkv.weight"
FC1 = "mlp.linear_fc1.weight"
HF_QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
HF_FC1 = ("mlp.gate_proj.weight", "mlp.up_proj.weight")


def split_qkv(spec: ModelSpec, qkv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Megatron's grouped fused QKV [g·(h/g + 2)·d, hidden] → (q [h·d], k [g·d], v [g·d])."""
    g, d = spec.num_kv_heads, spec.kv_channels
    per = spec.num_attention_heads // g
    grouped = qkv.reshape(g, per + 2, d, qkv.shape[-1])
    q = grouped[:, :per].reshape(g * per * d, -1)
    k = grouped[:, per].reshape(g * d, -1)
    v = grouped[:, per + 1].reshape(g * d, -1)
    return q, k, v


def fuse_qkv(spec: ModelSpec, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The inverse of :func:`split_qkv`."""
    g, d = spec.num_kv_heads, spec.kv_channels
    per = spec.num_attention_heads // g
    cols = q.shape[-1]
    grouped = np.concatenate([q.reshape(g, per, d, cols), k.reshape(g, 1, d, cols),
                              v.reshape(g, 1, d, cols)], axis=1)
    return grouped.reshape(g * (per + 2) * d, cols)


def hf_tensors(spec: ModelSpec, params: Mapping[str, np.ndarray]) -> Iterator[tuple[str,
                                                                                  np.ndarray]]:
    """(Hugging Face name, array) for every tensor of ``params`` (Megatron logical names, any
    subset — e.g. one pipeline stage's), one at a time in ``tensor_specs`` order, so a loader
    can consume them without holding a second copy of the model. Unknown names raise."""
    hf_architecture(spec)
    known = {t.name: t.global_shape for t in tensor_specs(spec)}
    for name in params:
        if name not in known:
            raise UnsupportedArchitecture(f"{name!r} is not a tensor of {spec.name!r}")
    for name, shape in known.items():
        if name not in params:
            continue
        arr = np.asarray(params[name])
        if arr.shape != shape:
            raise UnsupportedArchitecture(f"{name!r} has shape {arr.shape}, {spec.name!r} "
                                          f"needs {shape}")
        if name in _GLOBAL:
            yield _GLOBAL[name], arr
            continue
        at = _layer_of(name)
        assert at is not None, name
        layer, rest = at
        prefix = f"model.layers.{layer}."
        if rest == QKV:
            for hf, part in zip(HF_QKV, split_qkv(spec, arr), strict=True):
                yield prefix + hf, np.ascontiguousarray(part)
        elif rest == FC1:
            half = spec.ffn_hidden_size
            yield prefix + HF_FC1[0], np.ascontiguousarray(arr[:half])
            yield prefix + HF_FC1[1], np.ascontiguousarray(arr[half:])
        else:
            yield prefix + _LAYER[rest], arr


def to_hf(spec: ModelSpec, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """:func:`hf_tensors` collected into a dict."""
    return dict(hf_tensors(spec, params))


def hf_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor name of ``spec`` and its shape (what a full load must cover)."""
    hf_architecture(spec)
    h = spec.hidden_size
    out: dict[str, tuple[int, ...]] = {}
    for t in tensor_specs(spec):
        at = _layer_of(t.name)
        if at is None:
            out[_GLOBAL[t.name]] = t.global_shape
            continue
        prefix = f"model.layers.{at[0]}."
        if at[1] == QKV:
            rows = (spec.q_size, spec.kv_size, spec.kv_size)
            out.update({prefix + n: (r, h) for n, r in zip(HF_QKV, rows, strict=True)})
        elif at[1] == FC1:
            out.update({prefix + n: (spec.ffn_hidden_size, h) for n in HF_FC1})
        else:
            out[prefix + _LAYER[at[1]]] = t.global_shape
    return out


def from_hf(spec: ModelSpec, hf: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Megatron logical state from Hugging Face tensors (the inverse of :func:`to_hf`); every
    tensor of ``spec`` must be present (a tied model has no ``lm_head.weight``)."""
    hf_architecture(spec)
    want = hf_shapes(spec)
    missing = sorted(set(want) - set(hf))
    extra = sorted(set(hf) - set(want))
    if missing or extra:
        raise UnsupportedArchitecture(f"Hugging Face tensors of {spec.name!r}: missing "
                                      f"{missing[:4]}, unexpected {extra[:4]}")
    out: dict[str, np.ndarray] = {}
    for t in tensor_specs(spec):
        at = _layer_of(t.name)
        if at is None:
            out[t.name] = np.asarray(hf[_GLOBAL[t.name]])
            continue
        layer, rest = at
        prefix = f"model.layers.{layer}."
        if rest == QKV:
            q, k, v = (np.asarray(hf[prefix + n]) for n in HF_QKV)
            out[t.name] = fuse_qkv(spec, q, k, v)
        elif rest == FC1:
            out[t.name] = np.concatenate([np.asarray(hf[prefix + n]) for n in HF_FC1], axis=0)
        else:
            out[t.name] = np.asarray(hf[prefix + _LAYER[rest]])
    return out
