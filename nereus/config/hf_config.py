"""A Hugging Face ``config.json`` (already parsed) → the architecture Nereus runs (pure).

Nereus runs the decoder-only Llama family on Megatron-core: ``llama`` (Llama 2/3, Llama 3.1's
``llama3`` RoPE scaling), ``mistral``, ``qwen2`` (a q/k/v bias) and ``qwen3`` (per-head q/k
RMSNorm), tied or untied embeddings, as ``*ForCausalLM`` (actor, reference, a critic's trunk)
or ``*ForSequenceClassification`` / ``*ForTokenClassification`` with one label (a reward model's
or a critic's ``score`` head). Both transformers 4.x field names (``rope_theta`` and
``rope_scaling``) and 5.x's (``rope_parameters``) are read. Everything else is refused with one
line naming the field: a mixture of experts, an unknown ``model_type``, biases Megatron's layout
has no place for (``attention_bias``, ``mlp_bias``), partial rotary dimensions, RoPE scalings
other than ``linear`` and ``llama3``, quantized weights, an activation other than SiLU. A
sliding window is accepted only where it never slides: :func:`sliding_window` gives it, and the
job's sequences must fit in it (:func:`check_window`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nereus.config import fields as f
from nereus.emu.hf_slices import LM_HEAD, SCORE
from nereus.errors import ConfigError
from nereus.spec.model import ModelSpec, RopeScaling

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
HEAD_SUFFIXES = (("ForCausalLM", LM_HEAD), ("ForSequenceClassification", SCORE),
                 ("ForTokenClassification", SCORE))
# keys by which a config.json announces a mixture of experts
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size",
            "num_experts_per_tok")
ROPE_TYPES = ("default", "linear", "llama3")
DEFAULT_NORM_EPS = 1e-6  # transformers' default rms_norm_eps of all four families
DEFAULT_ROPE_THETA = 10000.0


def _at(path: str, key: str) -> str:
    return f"{path}/config.json.{key}"


def _int(path: str, cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ConfigError(_at(path, key), None, "missing; a positive integer is needed")
    return f.positive_int(_at(path, key), value)


def head_kind(path: str, cfg: Mapping[str, Any]) -> str:
    """``lm_head`` or ``score`` from ``architectures`` (a causal LM when it is absent)."""
    archs = cfg.get("architectures") or ["ForCausalLM"]
    if not isinstance(archs, list) or len(archs) != 1 or not isinstance(archs[0], str):
        raise ConfigError(_at(path, "architectures"), archs, "must name one architecture")
    for suffix, head in HEAD_SUFFIXES:
        if archs[0].endswith(suffix):
            if head == SCORE:
                labels = cfg.get("num_labels", len(cfg.get("id2label") or {}) or 1)
                if labels != 1:
                    raise ConfigError(_at(path, "num_labels"), labels,
                                      "a reward model or critic has one output (num_labels: 1)")
            return head
    raise ConfigError(_at(path, "architectures"), archs[0], "must be a *ForCausalLM, "
                      "*ForSequenceClassification or *ForTokenClassification model")


def _rope(path: str, cfg: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    """(base, scaling) from ``rope_parameters`` (transformers 5) or ``rope_theta`` and
    ``rope_scaling`` (transformers 4)."""
    params = cfg.get("rope_parameters")
    key = "rope_parameters"
    if params is None:
        params = dict(cfg.get("rope_scaling") or {})
        key = "rope_scaling"
        params.setdefault("rope_theta", cfg.get("rope_theta", DEFAULT_ROPE_THETA))
    if not isinstance(params, Mapping):
        raise ConfigError(_at(path, key), params, "must be a mapping")
    if "full_attention" in params and isinstance(params["full_attention"], Mapping):
        params = params["full_attention"]  # per layer type (transformers 5)
    theta = f.positive_float(_at(path, f"{key}.rope_theta"),
                             params.get("rope_theta", cfg.get("rope_theta",
                                                              DEFAULT_ROPE_THETA)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ConfigError(_at(path, f"{key}.rope_type"), kind,
                          f"Nereus runs RoPE of type {', '.join(ROPE_TYPES)}")
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ConfigError(_at(path, "partial_rotary_factor"), partial,
                          "Nereus rotates the whole head (1.0)")
    if kind == "default":
        return theta, None
    factor = f.positive_float(_at(path, f"{key}.factor"), params.get("factor"))
    if kind == "linear":
        return theta, RopeScaling("linear", factor)
    low = f.positive_float(_at(path, f"{key}.low_freq_factor"), params.get("low_freq_factor"))
    high = f.positive_float(_at(path, f"{key}.high_freq_factor"),
                            params.get("high_freq_factor"))
    if high <= low:
        raise ConfigError(_at(path, f"{key}.high_freq_factor"), high,
                          f"must exceed low_freq_factor={low}")
    orig = f.positive_int(_at(path, f"{key}.original_max_position_embeddings"),
                          params.get("original_max_position_embeddings",
                                     cfg.get("max_position_embeddings")))
    return theta, RopeScaling("llama3", factor, low, high, orig)


def _refusals(path: str, cfg: Mapping[str, Any], model_type: str) -> None:
    for key in MOE_KEYS:
        if cfg.get(key):
            raise ConfigError(_at(path, key), cfg[key], "a mixture-of-experts model; Nereus "
                              f"runs dense {', '.join(MODEL_TYPES)} models")
    if cfg.get("quantization_config"):
        raise ConfigError(_at(path, "quantization_config"), "...",
                          "quantized weights; Nereus reads float checkpoints (bf16, fp16, fp32)")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(_at(path, "hidden_act"), act, "Nereus runs SiLU-gated MLPs (silu)")
    if cfg.get("mlp_bias"):
        raise ConfigError(_at(path, "mlp_bias"), True, "Megatron's layout has no MLP bias here")
    if model_type != "qwen2" and cfg.get("attention_bias"):
        raise ConfigError(_at(path, "attention_bias"), True,
                          "an output-projection bias; Nereus runs a q/k/v bias only (qwen2)")


def spec_from_hf_config(path: str, cfg: Any, name: str) -> ModelSpec:
    """The ModelSpec of a ``config.json`` (``path``: the YAML field naming the checkpoint)."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{path}/config.json", "...", "must be a JSON object")
    model_type = cfg.get("model_type")
    if model_type not in MODEL_TYPES:
        moe = isinstance(model_type, str) and ("moe" in model_type or model_type == "mixtral")
        rule = "a mixture-of-experts model; " if moe else "unknown model_type; "
        raise ConfigError(_at(path, "model_type"), model_type,
                          f"{rule}Nereus runs {', '.join(MODEL_TYPES)}")
    _refusals(path, cfg, model_type)
    head_kind(path, cfg)
    heads = _int(path, cfg, "num_attention_heads")
    hidden = _int(path, cfg, "hidden_size")
    head_dim = cfg.get("head_dim")
    head_dim = 0 if head_dim is None else f.positive_int(_at(path, "head_dim"), head_dim)
    if head_dim == hidden // heads and hidden % heads == 0:
        head_dim = 0  # the default: hidden / heads
    theta, scaling = _rope(path, cfg)
    eps = f.positive_float(_at(path, "rms_norm_eps"), cfg.get("rms_norm_eps",
                                                               DEFAULT_NORM_EPS))
    tie = cfg.get("tie_word_embeddings", False)
    return ModelSpec(
        name=name,
        num_layers=_int(path, cfg, "num_hidden_layers"),
        hidden_size=hidden,
        ffn_hidden_size=_int(path, cfg, "intermediate_size"),
        num_attention_heads=heads,
        num_kv_heads=_int(path, cfg, "num_key_value_heads", heads),
        vocab_size=_int(path, cfg, "vocab_size"),
        head_dim=head_dim,
        gated_mlp=True,
        tie_embeddings=f.boolean(_at(path, "tie_word_embeddings"), tie),
        qk_norm=model_type == "qwen3",
        norm="rmsnorm",
        learned_positions=False,
        max_seq_len=f.positive_int(_at(path, "max_position_embeddings"),
                                   cfg.get("max_position_embeddings", 2048), "MAX_TOKENS"),
        rope_theta=theta,
        rope_scaling=scaling,
        norm_eps=eps,
        qkv_bias=model_type == "qwen2",
    )


def sliding_window(cfg: Mapping[str, Any]) -> int | None:
    """The attention window a ``config.json`` asks for, or None when attention is full:
    Mistral's ``sliding_window``; Qwen's where ``use_sliding_window`` (or a ``layer_types``
    entry ``sliding_attention``)."""
    window = cfg.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None
    if cfg.get("model_type") == "mistral":
        return window
    layers = cfg.get("layer_types") or []
    if cfg.get("use_sliding_window") or "sliding_attention" in layers:
        return window
    return None


def check_window(path: str, cfg: Mapping[str, Any], tokens: int) -> None:
    """Nereus runs full attention: a sliding window is refused unless no sequence of ``tokens``
    (prompt plus generation) is longer than it (then it never slides)."""
    window = sliding_window(cfg)
    if window is not None and tokens > window:
        raise ConfigError(_at(path, "sliding_window"), window,
                          f"a sliding window Nereus cannot run: the job's sequences reach "
                          f"{tokens} tokens (job.prompt_len + generation); at most {window} "
                          "keep attention full")
