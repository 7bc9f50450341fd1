"""``models.<role>: {checkpoint: DIR}``: a Hugging Face checkpoint as a role's model (pure).

The file layer (:mod:`nereus.config.checkpoint_files`) reads a checkpoint folder's
``config.json``, its safetensors index and the headers of its safetensors files (names, dtypes,
shapes: never the weights), ``generation_config.json`` and ``tokenizer_config.json`` into
:class:`CheckpointFacts`; :func:`role_checkpoint` turns them into the role's
:class:`ModelCheckpoint`: the architecture (:func:`nereus.config.hf_config.spec_from_hf_config`),
the head the role reads, and the check that every tensor that architecture needs is there with
its shape. What each role takes:

- ``actor`` (and ``reference``, which defaults to the actor's): a ``*ForCausalLM``;
- ``critic``: a ``*ForCausalLM`` (its trunk, with a new scalar value head:
  :func:`nereus.emu.hf_slices.value_head_row`) or a reward model / critic
  (``*ForSequenceClassification`` / ``*ForTokenClassification``: its ``score`` head);
- ``reward``: a ``*ForSequenceClassification`` (its ``score`` head).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from nereus.config.hf_config import head_kind, spec_from_hf_config
from nereus.emu.hf_slices import LM_HEAD, NEW_HEAD, SCORE, needed_tensors
from nereus.errors import ConfigError
from nereus.spec.model import ModelSpec

FLOAT_DTYPES = {"F32": 4, "F16": 2, "BF16": 2}
# tensors a checkpoint may hold that the role does not read
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
OPTIONAL_HEADS = ("lm_head.weight", "score.weight", "score.bias")


@dataclass(frozen=True)
class HfTensorInfo:
    """One tensor of a checkpoint as its safetensors header gives it."""

    name: str
    dtype: str  # safetensors' name: F32, BF16, ...
    shape: tuple[int, ...]
    file: str  # the safetensors file's name in the folder

    @property
    def itemsize(self) -> int:
        return FLOAT_DTYPES.get(self.dtype, 0)


@dataclass(frozen=True)
class CheckpointFacts:
    """What the file layer read of one checkpoint folder (plain data, no weights)."""

    directory: str  # absolute
    config: Mapping[str, Any]
    tensors: tuple[HfTensorInfo, ...]
    generation_config: Mapping[str, Any] | None = None
    tokenizer_config: Mapping[str, Any] | None = None
    files: tuple[str, ...] = ()  # every regular file's name in the folder


@dataclass(frozen=True)
class ModelCheckpoint:
    """A role's model from a checkpoint: where, which head, the architecture, the tensors."""

    role: str
    directory: str
    head: str  # nereus.emu.hf_slices.HEADS
    spec: ModelSpec
    facts: CheckpointFacts

    def tensor(self, name: str) -> HfTensorInfo:
        for t in self.facts.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def dtype(self) -> str:
        """The dtype the checkpoint's weights are stored in (its most common one)."""
        counts: dict[str, int] = {}
        for t in self.facts.tensors:
            counts[t.dtype] = counts.get(t.dtype, 0) + 1
        return max(sorted(counts), key=lambda d: counts[d])

    def eos_ids(self) -> tuple[int, ...]:
        """EOS ids the checkpoint's ``generation_config.json`` (else ``config.json``) names."""
        for source in (self.facts.generation_config, self.facts.config):
            got = _ids((source or {}).get("eos_token_id"))
            if got:
                return got
        return ()


def _ids(value: Any) -> tuple[int, ...]:
    items = value if isinstance(value, list) else [value]
    return tuple(int(v) for v in items
                 if isinstance(v, int) and not isinstance(v, bool) and v >= 0)


def spec_name(directory: str) -> str:
    return os.path.basename(os.path.normpath(directory)) or "checkpoint"


def role_checkpoint(path: str, role: str, facts: CheckpointFacts) -> ModelCheckpoint:
    """The checkpoint of ``role`` (``path``: its YAML field, ``models.<role>``), checked."""
    where = f"{path}.checkpoint"
    spec = spec_from_hf_config(where, facts.config, spec_name(facts.directory))
    kind = head_kind(where, facts.config)
    if role in ("actor", "reference") and kind != LM_HEAD:
        raise ConfigError(where, facts.directory, f"the {role} needs a *ForCausalLM checkpoint "
                          f"(config.json names {facts.config.get('architectures')})")
    if role == "reward" and kind != SCORE:
        raise ConfigError(where, facts.directory, "the reward model needs a "
                          "*ForSequenceClassification checkpoint (its score head)")
    head = kind
    if role == "critic" and kind == LM_HEAD:
        head = NEW_HEAD  # the trunk of a causal LM, a new value head
    if head != LM_HEAD:
        spec = replace(spec, name=f"{spec.name}+value-head", tie_embeddings=False)
    check_tensors(where, facts, spec, head)
    return ModelCheckpoint(role, facts.directory, head, spec, facts)


def check_tensors(where: str, facts: CheckpointFacts, spec: ModelSpec, head: str) -> None:
    """Every tensor ``spec`` with ``head`` reads is there with its shape and a float dtype; no
    tensor of the trunk is left over (it would mean an architecture config.json does not
    describe)."""
    have = {t.name: t for t in facts.tensors}
    want = needed_tensors(spec, head)
    for name, shape in want.items():
        t = have.get(name)
        if t is None:
            raise ConfigError(where, facts.directory, f"tensor {name!r} is missing (config.json "
                              "describes a model that has it)")
        if t.shape != shape:
            raise ConfigError(where, facts.directory, f"tensor {name!r} in {t.file} has shape "
                              f"{list(t.shape)}; config.json's architecture needs {list(shape)}")
        if t.dtype not in FLOAT_DTYPES:
            raise ConfigError(where, facts.directory, f"tensor {name!r} in {t.file} is "
                              f"{t.dtype}; Nereus reads {', '.join(FLOAT_DTYPES)} weights")
    for name, t in have.items():
        if name in want or name in OPTIONAL_HEADS or name.endswith(IGNORED_SUFFIXES):
            continue
        raise ConfigError(where, facts.directory, f"tensor {name!r} in {t.file} is not part of "
                          "the architecture config.json describes")
