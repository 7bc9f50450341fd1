"""Parsed YAML data → a checked ``Config`` (a ``Setup`` plus sections other modules own). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from nereus.config import fields as f
from nereus.config.cluster import parse_cluster
from nereus.config.job import build_job, check_lengths, parse_controller, parse_job_fields
from nereus.config.models import parse_models
from nereus.errors import ConfigError
from nereus.spec.hardware import GpuSpec
from nereus.spec.job import ControllerSpec, Setup

# Sections this package turns into the Setup.
CORE_SECTIONS = ("job", "models", "cluster", "controller")
REQUIRED_SECTIONS = ("models", "cluster")
# Sections another module validates: they are passed through raw, as read-only mappings.
# To add one, append its name here and read it with ``Config.section(name)``.
EXTENSION_SECTIONS = ("runtime", "data", "reward")


@dataclass(frozen=True)
class Config:
    """A checked configuration: the planner's ``Setup`` plus the raw extension sections."""

    setup: Setup
    sections: tuple[tuple[str, Mapping[str, Any]], ...] = ()

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
                 detected_gpu: GpuSpec | None = None) -> Config:
    """Check a parsed YAML document; the first broken rule raises ``ConfigError``.
    ``detected_gpu``: what ``cluster.gpu: auto`` stands for (the shell reads the node's
    inventory, :func:`nereus.cluster.probe.detected_gpu`)."""
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
    models = parse_models(
        data["models"], algorithm=job.algorithm, reward_model=job.reward_model
    )
    check_lengths(job, models)
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
                  sections=tuple(sections))
