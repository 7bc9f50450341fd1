"""``runtime.save_hf``: export trained models as Hugging Face checkpoints (checked here, pure).

``{dir: DIR, every: N, roles: [critic], max_file_gb: G}``: after every ``N``-th step (``every``
0 or absent: none in between), at the end of the run and when the run is preempted, the actor
(and each role ``roles`` adds: ``critic``, PPO only) is written as a Hugging Face checkpoint
into ``DIR/step-<k>/<role>`` (``k`` steps done): sharded safetensors of at most ``max_file_gb``
GB each (default 5) with their index, ``config.json``, ``generation_config.json`` and the
tokenizer files of the source checkpoint (:mod:`nereus.hf.export`). The actor must be a
Llama-family architecture (a Hugging Face checkpoint, or RoPE, RMSNorm and a SwiGLU MLP).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nereus.config import fields as f
from nereus.errors import ConfigError
from nereus.spec.job import Setup

KEYS = ("dir", "every", "roles", "max_file_gb")
EXTRA_ROLES = ("actor", "critic")
DEFAULT_MAX_FILE_GB = 5.0


@dataclass(frozen=True)
class SaveHfOptions:
    """``runtime.save_hf`` checked; ``dir`` empty: no export."""

    dir: str = ""
    every: int = 0
    roles: tuple[str, ...] = ("actor",)
    max_file_gb: float = DEFAULT_MAX_FILE_GB

    @property
    def enabled(self) -> bool:
        return bool(self.dir)

    def due(self, steps_done: int, total_steps: int) -> bool:
        """Whether the boundary after ``steps_done`` steps exports (every N, and the end)."""
        if not self.enabled or steps_done <= 0:
            return False
        return steps_done == total_steps or bool(self.every and steps_done % self.every == 0)

    def to_dict(self) -> dict[str, Any]:
        return {"dir": self.dir, "every": self.every, "roles": list(self.roles),
                "max_file_gb": self.max_file_gb}

    @staticmethod
    def from_dict(d: Mapping[str, Any] | None) -> SaveHfOptions:
        if not d:
            return SaveHfOptions()
        return SaveHfOptions(str(d["dir"]), int(d["every"]), tuple(d["roles"]),
                             float(d["max_file_gb"]))


def parse_save_hf(raw: Any, setup: Setup, path: str = "runtime.save_hf") -> SaveHfOptions:
    """Check ``runtime.save_hf`` against the job (the roles it has, an exportable actor)."""
    if raw is None:
        return SaveHfOptions()
    raw = f.mapping(path, raw, KEYS)
    every = f.non_negative_int(f.join(path, "every"), raw.get("every", 0), "MAX_STEPS")
    roles_raw = raw.get("roles", [])
    if not isinstance(roles_raw, list):
        raise ConfigError(f.join(path, "roles"), roles_raw, "must be a list of roles")
    roles = ["actor"]
    for i, role in enumerate(roles_raw):
        at = f"{f.join(path, 'roles')}[{i}]"
        f.choice(at, role, EXTRA_ROLES)
        if role == "critic" and setup.job.algorithm != "ppo":
            raise ConfigError(at, role, f"{setup.job.algorithm} has no critic")
        if role not in roles:
            roles.append(role)
    size = f.positive_float(f.join(path, "max_file_gb"), raw.get("max_file_gb",
                                                                 DEFAULT_MAX_FILE_GB),
                            "MAX_MEMORY_GB")
    # the values given are checked before a missing dir: a bad value is named as such
    if "dir" not in raw:
        raise ConfigError(f.join(path, "dir"), None, "missing: the folder exports go into")
    folder = f.path(f.join(path, "dir"), raw["dir"])
    if not folder:
        raise ConfigError(f.join(path, "dir"), folder, "must be a folder path")
    from nereus.emu.hf_layout import UnsupportedArchitecture, hf_architecture

    for role in roles:
        if role == "critic" and setup.job.model(role).tie_embeddings:
            raise ConfigError(f.join(path, "roles"), role, "the critic's tied embeddings leave "
                              "no scalar head of its own to export")
        try:
            hf_architecture(setup.job.model(role))
        except UnsupportedArchitecture as e:
            raise ConfigError(f.join(path, "roles") if role != "actor" else f.join(path, "dir"),
                              role, f"the {role} cannot be exported: {e}") from None
    return SaveHfOptions(folder, every, tuple(roles), size)
