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

Qwen2's fused q/k/v bias (``linear_qkv.bias``) splits like the weight's rows into
``self_attn.{q,k,v}_proj.bias``. Architectures the Llama family cannot express are rejected with
:class:`UnsupportedArchitecture`: learned absolute positions, LayerNorm (with bias), a non-gated
MLP. The slice-by-slice form of this mapping (what a rank reads of each Hugging Face tensor for
its shard, and the scalar heads of critics and reward models) is :mod:`nereus.emu.hf_slices`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from nereus.emu.shards import tensor_specs
from nereus.errors import NereusError
from nereus.spec.model import ModelSpec

LLAMA = "LlamaForCausalLM"
QWEN2 = "Qwen2ForCausalLM"  # Llama plus a q/k/v bias (qkv_bias)
QWEN3 = "Qwen3ForCausalLM"  # Llama plus per-head RMSNorm on q and k (qk_norm)
MODEL_TYPES = {LLAMA: "llama", QWEN2: "qwen2", QWEN3: "qwen3"}


class UnsupportedArchitecture(NereusError):
    """A model the Hugging Face Llama-family layout (and so vLLM's loader) cannot express."""


def hf_architecture(spec: ModelSpec) -> str:
    """``LlamaForCausalLM`` (or ``Qwen3ForCausalLM`` with qk_norm) for ``spec``, else raise."""
    rules = [
        (spec.learned_positions, "learned absolute position embeddings (Llama uses RoPE)"),
        (spec.norm != "rmsnorm", f"norm={spec.norm!r} (Llama uses RMSNorm without bias)"),
        (not spec.gated_mlp, "a non-gated MLP (Llama's MLP is SwiGLU: gate, up, down)"),
        (spec.qkv_bias and spec.qk_norm, "both a q/k/v bias and q/k norms"),
    ]
    for bad, what in rules:
        if bad:
            raise UnsupportedArchitecture(
                f"model {spec.name!r} has {what}: the Hugging Face Llama family (vLLM's "
                "loader, runtime.save_hf) cannot express it")
    return QWEN3 if spec.qk_norm else QWEN2 if spec.qkv_bias else LLAMA


def rope_scaling_dict(spec: ModelSpec) -> dict[str, Any] | None:
    """``rope_scaling`` of ``config.json`` (transformers 4.x's field), or None."""
    sc = spec.rope_scaling
    if sc is None:
        return None
    if sc.kind == "linear":
        return {"rope_type": "linear", "factor": sc.factor}
    return {"rope_type": sc.kind, "factor": sc.factor, "low_freq_factor": sc.low_freq_factor,
            "high_freq_factor": sc.high_freq_factor,
            "original_max_position_embeddings": sc.original_max_position_embeddings}


def hf_config(spec: ModelSpec, *, eos_token_id: int | list[int], pad_token_id: int,
              bos_token_id: int | None, torch_dtype: str = "float32",
              max_position_embeddings: int = 0) -> dict[str, Any]:
    """The ``config.json`` of ``spec`` as a Hugging Face Llama-family model (plain data), with
    the spec's RoPE base and scaling and norm epsilon; ``max_position_embeddings`` defaults to
    ``spec.max_seq_len``."""
    arch = hf_architecture(spec)
    return {
        "architectures": [arch],
        "model_type": MODEL_TYPES[arch],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.ffn_hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.kv_channels,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings or spec.max_seq_len,
        "rms_norm_eps": spec.norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_scaling": rope_scaling_dict(spec),
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


def layer_of(name: str) -> tuple[int, str] | None:
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[0] == "decoder" and parts[1] == "layers":
        return int(parts[2]), parts[3]
    return None


GLOBAL_NAMES = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}
LAYER_NAMES = {  # Megatron suffix → HF suffix, for the tensors that map one to one
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
QKV = "self_attention.linear_qkv.weight"
QKV_BIAS = "self_attention.linear_qkv.bias"
FC1 = "mlp.linear_fc1.weight"
HF_QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
HF_QKV_BIAS = ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")
HF_FC1 = ("mlp.gate_proj.weight", "mlp.up_proj.weight")


def split_qkv(spec: ModelSpec, qkv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Megatron's grouped fused QKV [g·(h/g + 2)·d, hidden] → (q [h·d], k [g·d], v [g·d]);
    a bias [g·(h/g + 2)·d] splits the same way into 1-D parts."""
    g, d = spec.num_kv_heads, spec.kv_channels
    per = spec.num_attention_heads // g
    tail = qkv.shape[1:]
    grouped = qkv.reshape(g, per + 2, d, *tail)
    q = grouped[:, :per].reshape(g * per * d, *tail)
    k = grouped[:, per].reshape(g * d, *tail)
    v = grouped[:, per + 1].reshape(g * d, *tail)
    return q, k, v


def fuse_qkv(spec: ModelSpec, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The inverse of :func:`split_qkv`."""
    g, d = spec.num_kv_heads, spec.kv_channels
    per = spec.num_attention_heads // g
    tail = q.shape[1:]
    grouped = np.concatenate([q.reshape(g, per, d, *tail), k.reshape(g, 1, d, *tail),
                              v.reshape(g, 1, d, *tail)], axis=1)
    return grouped.reshape(g * (per + 2) * d, *tail)


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
        if name in GLOBAL_NAMES:
            yield GLOBAL_NAMES[name], arr
            continue
        at = layer_of(name)
        assert at is not None, name
        layer, rest = at
        prefix = f"model.layers.{layer}."
        if rest in (QKV, QKV_BIAS):
            for hf, part in zip(HF_QKV if rest == QKV else HF_QKV_BIAS, split_qkv(spec, arr),
                                strict=True):
                yield prefix + hf, np.ascontiguousarray(part)
        elif rest == FC1:
            half = spec.ffn_hidden_size
            yield prefix + HF_FC1[0], np.ascontiguousarray(arr[:half])
            yield prefix + HF_FC1[1], np.ascontiguousarray(arr[half:])
        else:
            yield prefix + LAYER_NAMES[rest], arr


def to_hf(spec: ModelSpec, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """:func:`hf_tensors` collected into a dict."""
    return dict(hf_tensors(spec, params))


def hf_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor name of ``spec`` and its shape (what a full load must cover)."""
    hf_architecture(spec)
    h = spec.hidden_size
    out: dict[str, tuple[int, ...]] = {}
    for t in tensor_specs(spec):
        at = layer_of(t.name)
        if at is None:
            out[GLOBAL_NAMES[t.name]] = t.global_shape
            continue
        prefix = f"model.layers.{at[0]}."
        rows = (spec.q_size, spec.kv_size, spec.kv_size)
        if at[1] == QKV:
            out.update({prefix + n: (r, h) for n, r in zip(HF_QKV, rows, strict=True)})
        elif at[1] == QKV_BIAS:
            out.update({prefix + n: (r,) for n, r in zip(HF_QKV_BIAS, rows, strict=True)})
        elif at[1] == FC1:
            out.update({prefix + n: (spec.ffn_hidden_size, h) for n in HF_FC1})
        else:
            out[prefix + LAYER_NAMES[at[1]]] = t.global_shape
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
        at = layer_of(t.name)
        if at is None:
            out[t.name] = np.asarray(hf[GLOBAL_NAMES[t.name]])
            continue
        layer, rest = at
        prefix = f"model.layers.{layer}."
        if rest in (QKV, QKV_BIAS):
            q, k, v = (np.asarray(hf[prefix + n]) for n in (HF_QKV if rest == QKV
                                                             else HF_QKV_BIAS))
            out[t.name] = fuse_qkv(spec, q, k, v)
        elif rest == FC1:
            out[t.name] = np.concatenate([np.asarray(hf[prefix + n]) for n in HF_FC1], axis=0)
        else:
            out[t.name] = np.asarray(hf[prefix + LAYER_NAMES[rest]])
    return out
