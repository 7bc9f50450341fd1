"""The ``models:`` section: role → preset name, explicit architecture or Hugging Face checkpoint
(``{checkpoint: DIR}``: :mod:`nereus.config.checkpoint`), checked per algorithm."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from nereus.config import fields as f
from nereus.config.checkpoint import CheckpointFacts, ModelCheckpoint, role_checkpoint
from nereus.errors import ConfigError
from nereus.spec.model import MODEL_PRESETS, ROPE_SCALINGS, ModelSpec, RopeScaling
from nereus.spec.workflow import ROLES

# Fields of an explicit architecture; ``preset`` names a base whose fields the others override.
REQUIRED_ARCH_KEYS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads",
    "vocab_size",
)
OPTIONAL_ARCH_KEYS = (
    "name", "head_dim", "gated_mlp", "tie_embeddings", "qk_norm", "norm", "learned_positions",
    "max_seq_len", "rope_theta", "rope_scaling", "norm_eps", "qkv_bias",
)
ROPE_SCALING_KEYS = ("type", "factor", "low_freq_factor", "high_freq_factor",
                     "original_max_position_embeddings")
ARCH_KEYS = ("preset", *REQUIRED_ARCH_KEYS, *OPTIONAL_ARCH_KEYS)
CHECKPOINT_KEYS = ("checkpoint",)
# (field, folder) → what the file layer read of the folder (nereus.config.checkpoint_files)
CheckpointReader = Callable[[str, Any], CheckpointFacts]
NORMS = ("rmsnorm", "layernorm")
CUSTOM_NAME = "custom"


def preset(path: str, value: Any) -> ModelSpec:
    if not isinstance(value, str) or value not in MODEL_PRESETS:
        given = value if isinstance(value, str) else ""
        rule = f.unknown_rule("model preset", given, MODEL_PRESETS)
        raise ConfigError(path, value, f"{rule} (or an architecture mapping)")
    return MODEL_PRESETS[value]


def _arch_value(path: str, key: str, value: Any) -> Any:
    if key == "name":
        return f.name(path, value)
    if key == "norm":
        return f.choice(path, value, NORMS)
    if key in ("gated_mlp", "tie_embeddings", "qk_norm", "learned_positions", "qkv_bias"):
        return f.boolean(path, value)
    if key in ("rope_theta", "norm_eps"):
        return f.positive_float(path, value)
    if key == "rope_scaling":
        return None if value is None else rope_scaling(path, value)
    if key == "head_dim":
        return f.non_negative_int(path, value)
    if key == "max_seq_len":
        return f.positive_int(path, value, "MAX_TOKENS")
    return f.positive_int(path, value)


def rope_scaling(path: str, raw: Any) -> RopeScaling:
    """``{type: linear|llama3, factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings}`` (the last three: llama3 only, Llama 3.1's defaults)."""
    raw = f.mapping(path, raw, ROPE_SCALING_KEYS)
    kind = f.choice(f.join(path, "type"), raw.get("type"), ROPE_SCALINGS)
    factor = f.positive_float(f.join(path, "factor"), raw.get("factor"))
    if kind == "linear":
        for key in ROPE_SCALING_KEYS[2:]:
            if key in raw:
                raise ConfigError(f.join(path, key), raw[key], "only with type: llama3")
        return RopeScaling(kind, factor)
    d = RopeScaling("llama3", factor)
    low = f.positive_float(f.join(path, "low_freq_factor"),
                           raw.get("low_freq_factor", d.low_freq_factor))
    high = f.positive_float(f.join(path, "high_freq_factor"),
                            raw.get("high_freq_factor", d.high_freq_factor))
    if high <= low:
        raise ConfigError(f.join(path, "high_freq_factor"), high, f"must exceed low_freq_factor={low}")
    orig = f.positive_int(f.join(path, "original_max_position_embeddings"),
                          raw.get("original_max_position_embeddings",
                                  d.original_max_position_embeddings), "MAX_TOKENS")
    return RopeScaling(kind, factor, low, high, orig)


def architecture(path: str, raw: Mapping[str, Any]) -> ModelSpec:
    """An explicit architecture mapping (optionally on top of ``preset``) as a checked ModelSpec."""
    raw = f.mapping(path, raw, ARCH_KEYS)
    values = {k: _arch_value(f.join(path, k), k, v) for k, v in raw.items() if k != "preset"}
    if "preset" in raw:
        spec = replace(preset(f.join(path, "preset"), raw["preset"]), **values)
    else:
        for key in REQUIRED_ARCH_KEYS:
            if key not in raw:
                raise ConfigError(
                    f.join(path, key), None, "missing; an architecture without a preset needs "
                    + ", ".join(REQUIRED_ARCH_KEYS),
                )
        spec = ModelSpec(**{"name": CUSTOM_NAME, **values})
    check_architecture(path, spec)
    return spec


def check_architecture(path: str, spec: ModelSpec) -> None:
    """Shape rules a Megatron GPT layout needs: heads split the hidden size, kv groups the heads."""
    if spec.head_dim == 0 and spec.hidden_size % spec.num_attention_heads:
        raise ConfigError(
            f.join(path, "num_attention_heads"), spec.num_attention_heads,
            f"must divide hidden_size={spec.hidden_size} (or set head_dim)",
        )
    if spec.num_attention_heads % spec.num_kv_heads:
        raise ConfigError(
            f.join(path, "num_kv_heads"), spec.num_kv_heads,
            f"must divide num_attention_heads={spec.num_attention_heads}",
        )


def model(path: str, value: Any) -> ModelSpec:
    """One role's model: a preset name or an architecture mapping."""
    if isinstance(value, Mapping):
        return architecture(path, value)
    return preset(path, value)


def required_roles(algorithm: str, reward_model: bool) -> tuple[str, ...]:
    """Roles that must be named (``reference`` may be omitted: it defaults to the actor)."""
    roles = ["actor"]
    if algorithm == "ppo":
        roles.append("critic")
    if reward_model:
        roles.append("reward")
    return tuple(roles)


def parse_models(
    raw: Any, *, algorithm: str, reward_model: bool, path: str = "models",
    read_checkpoint: CheckpointReader | None = None,
) -> tuple[tuple[str, ModelSpec], ...]:
    """(role, ModelSpec) for every role the algorithm uses, in ``ROLES`` order."""
    return parse_model_sources(raw, algorithm=algorithm, reward_model=reward_model, path=path,
                               read_checkpoint=read_checkpoint)[0]


def checkpoint_model(path: str, role: str, raw: Mapping[str, Any],
                     read_checkpoint: CheckpointReader | None) -> ModelCheckpoint:
    """``{checkpoint: DIR}`` of ``role``: the folder read (by the file layer) and checked."""
    if "checkpoint" in raw and len(raw) > 1:
        other = next(k for k in raw if k != "checkpoint")
        raise ConfigError(f.join(path, other), raw[other], "a checkpoint's architecture comes "
                          "from its config.json; give only checkpoint")
    raw = f.mapping(path, raw, CHECKPOINT_KEYS)
    where = f.join(path, "checkpoint")
    folder = f.path(where, raw["checkpoint"])
    if read_checkpoint is None:
        raise ConfigError(where, folder, "a checkpoint is read by the config loader "
                          "(nereus.config.load_config)")
    return role_checkpoint(path, role, read_checkpoint(where, folder))


def parse_model_sources(
    raw: Any, *, algorithm: str, reward_model: bool, path: str = "models",
    read_checkpoint: CheckpointReader | None = None,
) -> tuple[tuple[tuple[str, ModelSpec], ...], tuple[tuple[str, ModelCheckpoint], ...]]:
    """(role, ModelSpec) for every role the algorithm uses, in ``ROLES`` order, and (role,
    checkpoint) of the roles whose model is a Hugging Face checkpoint (``reference`` takes the
    actor's when it is not named)."""
    raw = f.mapping(path, raw, ROLES)
    needed = required_roles(algorithm, reward_model)
    for role in needed:
        if role not in raw:
            why = {
                "actor": "every job needs an actor model",
                "critic": "ppo needs a critic model",
                "reward": "job.reward_model is true, so a reward model is needed",
            }[role]
            raise ConfigError(f.join(path, role), None, f"missing; {why}")
    for role in ("critic", "reward"):
        if role in raw and role not in needed:
            why = (
                f"{algorithm} has no critic; remove it"
                if role == "critic"
                else "job.reward_model is false (rule-based reward); remove it or set it true"
            )
            raise ConfigError(f.join(path, role), raw[role], f"not used: {why}")
    specs: dict[str, ModelSpec] = {}
    sources: dict[str, ModelCheckpoint] = {}
    for role, value in raw.items():
        if isinstance(value, Mapping) and "checkpoint" in value:
            sources[role] = checkpoint_model(f.join(path, role), role, value, read_checkpoint)
            specs[role] = sources[role].spec
        else:
            specs[role] = model(f.join(path, role), value)
    specs.setdefault("reference", specs["actor"])
    if "reference" not in sources and "reference" not in raw and "actor" in sources:
        sources["reference"] = replace(sources["actor"], role="reference")
    return (tuple((role, specs[role]) for role in ROLES if role in specs),
            tuple((role, sources[role]) for role in ROLES if role in sources))
