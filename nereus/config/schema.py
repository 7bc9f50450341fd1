"""Parsed YAML data → a checked ``Config`` (a ``Setup`` plus sections other modules own). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from nereus.config import fields as f
from nereus.config.checkpoint import ModelCheckpoint
from nereus.config.cluster import parse_cluster
from nereus.config.hf_config import check_window
from nereus.config.job import build_job, check_lengths, parse_controller, parse_job_fields
from nereus.config.models import CheckpointReader, parse_model_sources
from nereus.errors import ConfigError
from nereus.spec.hardware import GpuSpec
from nereus.spec.job import ControllerSpec, Setup

# Sections this package turns into the Setup.
CORE_SECTIONS = ("job", "models", "cluster", "controller")
REQUIRED_SECTIONS = ("models", "cluster")
# Sections another module validates: they are passed through raw, as read-only mappings.
# To add one, append its name here and read it with ``Config.section(name)``.
EXTENSION_SECTIONS = ("runtime",)


@dataclass(frozen=True)
class Config:
    """A checked configuration: the planner's ``Setup`` plus the raw extension sections."""

    setup: Setup
    sections: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    # (role, checkpoint) of every role whose model is a Hugging Face checkpoint
    checkpoints: tuple[tuple[str, ModelCheckpoint], ...] = ()

    def checkpoint(self, role: str) -> ModelCheckpoint | None:
        """The checkpoint of ``role``'s model, or None (a preset or explicit architecture)."""
        return dict(self.checkpoints).get(role)

    def section(self, name: str) -> Mapping[str, Any] | None:
        """The raw mapping of extension section ``name``, or None when the file has none."""
        for key, raw in self.sections:
            if key == name:
                return raw
        return None


def describe(value: Any) -> str:
    """A short name of a value's YAML type, for errors about whole documents."""
    if value is None:
        return "empty"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return f"a {type(value).__name__}"


def parse_config(data: Any, *, extensions: tuple[str, ...] = EXTENSION_SECTIONS,
                 detected_gpu: GpuSpec | None = None,
                 read_checkpoint: CheckpointReader | None = None) -> Config:
    """Check a parsed YAML document; the first broken rule raises ``ConfigError``.
    ``detected_gpu``: what ``cluster.gpu: auto`` stands for (the shell reads the node's
    inventory, :func:`nereus.cluster.probe.detected_gpu`); ``read_checkpoint``: how a
    ``models.<role>.checkpoint`` folder is read (the file layer,
    :func:`nereus.config.checkpoint_files.read_checkpoint`, which ``load_config`` passes)."""
    allowed = (*CORE_SECTIONS, *extensions)
    if not isinstance(data, Mapping):
        raise ConfigError(
            "config", describe(data), f"must be a mapping with sections {', '.join(allowed)}"
        )
    data = f.mapping("", data, allowed)
    for name in REQUIRED_SECTIONS:
        if name not in data:
            raise ConfigError(name, None, f"missing; a config needs {', '.join(REQUIRED_SECTIONS)}")
    job = parse_job_fields(data.get("job", {}))
    cluster = parse_cluster(data["cluster"], detected_gpu=detected_gpu)
    models, checkpoints = parse_model_sources(
        data["models"], algorithm=job.algorithm, reward_model=job.reward_model,
        read_checkpoint=read_checkpoint,
    )
    check_lengths(job, models)
    for role, ck in checkpoints:
        check_window(f"models.{role}.checkpoint", ck.facts.config,
                     job.prompt_len + (job.gen_len_p95 or job.gen_len))
    controller = (
        parse_controller(data["controller"]) if "controller" in data else ControllerSpec()
    )
    sections = []
    for name in extensions:
        if name in data:
            raw = data[name]
            if not isinstance(raw, Mapping):
                raise ConfigError(name, raw, "must be a mapping (checked by the module owning it)")
            sections.append((name, MappingProxyType(dict(raw))))
    return Config(setup=Setup(job=build_job(job, models, controller), cluster=cluster),
                  sections=tuple(sections), checkpoints=checkpoints)
