"""A Hugging Face ``config.json`` → ModelSpec, and the checks of a checkpoint's tensors (pure:
config.json and the tensor tables are plain data here; the files: ranks/test_hf_checkpoints.py).

The configs below are those transformers writes (4.x field names: ``rope_theta`` and
``rope_scaling``; 5.x: ``rope_parameters``); the public architectures' figures are their
config.json's.
"""

from __future__ import annotations

from typing import Any

import pytest

from nereus.config.checkpoint import CheckpointFacts, HfTensorInfo, role_checkpoint
from nereus.config.hf_config import check_window, sliding_window, spec_from_hf_config
from nereus.emu.hf_slices import LM_HEAD, NEW_HEAD, SCORE, needed_tensors
from nereus.errors import ConfigError
from nereus.spec.model import LLAMA_3_1_8B, QWEN2_5_0_5B, RopeScaling

P = "models.actor.checkpoint"

LLAMA31_V4: dict[str, Any] = {  # meta-llama/Llama-3.1-8B's config.json (transformers 4.x)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
}
QWEN25_V5: dict[str, Any] = {  # Qwen/Qwen2.5-0.5B as transformers 5 writes it
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
    "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
    "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "use_sliding_window": False,
    "sliding_window": 32768, "max_window_layers": 24, "layer_types": ["full_attention"] * 24,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "dtype": "bfloat16",
}


def test_llama31_with_its_rope_scaling_from_transformers_4_fields() -> None:
    spec = spec_from_hf_config(P, LLAMA31_V4, "llama")
    arch = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
            "num_kv_heads", "vocab_size", "tie_embeddings", "qk_norm")
    assert {k: getattr(spec, k) for k in arch} == {k: getattr(LLAMA_3_1_8B, k) for k in arch}
    assert spec.num_params() == LLAMA_3_1_8B.num_params()
    assert (spec.rope_theta, spec.norm_eps, spec.qkv_bias) == (500000.0, 1e-5, False)
    assert spec.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)


def test_qwen25_from_transformers_5_fields_has_its_bias_and_tied_embeddings() -> None:
    spec = spec_from_hf_config(P, QWEN25_V5, "qwen")
    assert spec.qkv_bias and spec.tie_embeddings and spec.rope_theta == 1e6
    assert spec.norm_eps == 1e-6 and spec.rope_scaling is None
    # Qwen2.5-0.5B has 494,032,768 parameters (its model card): the q/k/v biases included
    assert spec.num_params() == 494_032_768
    assert spec.num_params() - QWEN2_5_0_5B.num_params() == 24 * (896 + 2 * 128)
    assert sliding_window(QWEN25_V5) is None  # use_sliding_window: false


def test_qwen3_head_dim_and_qk_norm_and_mistral_window() -> None:
    qwen3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
             "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 8,
             "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 320,
             "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}
    spec = spec_from_hf_config(P, qwen3, "q3")
    assert spec.qk_norm and spec.kv_channels == 16 and spec.q_size == 128
    assert spec.rope_scaling == RopeScaling("linear", 2.0)
    mistral = {**qwen3, "model_type": "mistral", "head_dim": 8, "sliding_window": 4096,
               "rope_parameters": None, "rope_theta": 1e6}
    spec = spec_from_hf_config(P, mistral, "m")
    assert spec.head_dim == 0 and not spec.qk_norm and spec.rope_theta == 1e6
    check_window(P, mistral, 4096)  # never slides
    with pytest.raises(ConfigError, match="sliding window Nereus cannot run"):
        check_window(P, mistral, 4097)


@pytest.mark.parametrize("change, field", [
    ({"model_type": "qwen3_moe"}, "model_type"),
    ({"model_type": "gpt2"}, "model_type"),
    ({"num_local_experts": 8}, "num_local_experts"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type"),
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
    ({"architectures": ["LlamaModel"]}, "architectures"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                       "high_freq_factor": 1.0}}, "rope_scaling.high_freq_factor"),
])
def test_what_nereus_cannot_run_is_one_line_naming_the_field(change: dict[str, Any],
                                                               field: str) -> None:
    with pytest.raises(ConfigError) as e:
        spec_from_hf_config(P, {**LLAMA31_V4, **change}, "x")
    assert e.value.field == f"{P}/config.json.{field}"
    assert "\n" not in str(e.value)


def _facts(cfg: dict[str, Any], tensors: dict[str, tuple[int, ...]],
           dtype: str = "BF16") -> CheckpointFacts:
    return CheckpointFacts("/ck", cfg, tuple(HfTensorInfo(n, dtype, s, "model.safetensors")
                                             for n, s in sorted(tensors.items())),
                           {"eos_token_id": [7, 9]})


TINY = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 40, "tie_word_embeddings": True,
        "eos_token_id": 3}


def test_roles_take_their_heads_and_every_needed_tensor_is_checked() -> None:
    spec = spec_from_hf_config(P, TINY, "ck")
    full = needed_tensors(spec)
    assert "lm_head.weight" not in full and "model.layers.1.self_attn.k_proj.bias" in full
    actor = role_checkpoint("models.actor", "actor", _facts(TINY, full))
    assert actor.head == LM_HEAD and actor.spec == spec and actor.eos_ids() == (7, 9)
    critic = role_checkpoint("models.critic", "critic", _facts(TINY, full))
    assert critic.head == NEW_HEAD and not critic.spec.tie_embeddings  # its own value head
    rm_cfg = {**TINY, "architectures": ["Qwen2ForSequenceClassification"], "num_labels": 1}
    rm_tensors = {**full, "score.weight": (1, 32)}
    assert role_checkpoint("models.reward", "reward", _facts(rm_cfg, rm_tensors)).head == SCORE
    from_rm = role_checkpoint("models.critic", "critic", _facts(rm_cfg, rm_tensors))
    assert from_rm.head == SCORE and not from_rm.spec.tie_embeddings  # a critic from an RM
    with pytest.raises(ConfigError, match="needs a \\*ForSequenceClassification"):
        role_checkpoint("models.reward", "reward", _facts(TINY, full))
    with pytest.raises(ConfigError, match="needs a \\*ForCausalLM"):
        role_checkpoint("models.actor", "actor", _facts(rm_cfg, rm_tensors))
    with pytest.raises(ConfigError, match="one output"):
        role_checkpoint("models.reward", "reward", _facts({**rm_cfg, "num_labels": 2},
                                                          rm_tensors))


@pytest.mark.parametrize("edit, rule", [
    (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), "is missing"),
    (lambda t: t.update({"model.layers.0.self_attn.q_proj.weight": (32, 31)}), "has shape"),
    (lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": (32,)}), "not part of"),
])
def test_a_missing_misshapen_or_extra_tensor_is_refused(edit: Any, rule: str) -> None:
    spec = spec_from_hf_config(P, TINY, "ck")
    tensors = dict(needed_tensors(spec))
    edit(tensors)
    with pytest.raises(ConfigError, match=rule) as e:
        role_checkpoint("models.actor", "actor", _facts(TINY, tensors))
    assert e.value.field == P


def test_integer_weights_and_a_stray_lm_head_are_told_apart() -> None:
    spec = spec_from_hf_config(P, TINY, "ck")
    tensors = {**needed_tensors(spec), "lm_head.weight": (40, 32)}  # some tied checkpoints
    role_checkpoint("models.actor", "actor", _facts(TINY, tensors))  # keep one: ignored
    with pytest.raises(ConfigError, match="Nereus reads F32, F16, BF16"):
        role_checkpoint("models.actor", "actor", _facts(TINY, tensors, dtype="I8"))
