"""What ``nereus run`` measures and reports beyond its run log: validation, logged samples,
TensorBoard and wandb — keys of the ``runtime:`` section, checked here (pure).

``val_every`` (N > 0: after every N-th step and after the last one, the validation set
``data.val`` is generated greedily and scored: mean reward, pass@1, mean length; default 0,
none), ``val_samples`` (k > 0: also k sampled responses per validation prompt, with their mean
reward, pass@1 estimated over the samples and pass@k), ``log_samples`` (how many of each step's
responses the run log keeps as text with their rewards, default 4; every response's reward is
logged anyway), ``tensorboard`` (a folder rank 0 writes TensorBoard event files into — the same
scalars as the run log; a new folder, or the run's own when it is resumed), ``wandb``
(``{project, name, mode}``: the same scalars to Weights & Biases when ``wandb`` is installed;
``mode``: ``online``, ``offline`` or ``disabled``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nereus.config import fields as f
from nereus.errors import ConfigError

OUTPUT_KEYS = ("val_every", "val_samples", "log_samples", "tensorboard", "wandb")
WANDB_KEYS = ("project", "name", "mode")
WANDB_MODES = ("online", "offline", "disabled")
MAX_LOG_SAMPLES = 1 << 16


@dataclass(frozen=True)
class WandbOptions:
    project: str
    name: str = ""
    mode: str = "online"

    def to_dict(self) -> dict[str, Any]:
        return {"project": self.project, "name": self.name, "mode": self.mode}


@dataclass(frozen=True)
class OutputOptions:
    val_every: int = 0
    val_samples: int = 0
    log_samples: int = 4
    tensorboard: str = ""
    wandb: WandbOptions | None = field(default=None)

    def validates_after(self, step: int, steps: int) -> bool:
        """Whether validation runs after step ``step`` (0-based) of a run of ``steps``."""
        return self.val_every > 0 and ((step + 1) % self.val_every == 0 or step == steps - 1)

    def to_dict(self) -> dict[str, Any]:
        return {"val_every": self.val_every, "val_samples": self.val_samples,
                "log_samples": self.log_samples, "tensorboard": self.tensorboard,
                "wandb": None if self.wandb is None else self.wandb.to_dict()}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> OutputOptions:
        w = d.get("wandb")
        return OutputOptions(int(d.get("val_every", 0)), int(d.get("val_samples", 0)),
                             int(d.get("log_samples", 4)), str(d.get("tensorboard", "")),
                             None if w is None else WandbOptions(**w))


def _wandb(raw: Any) -> WandbOptions | None:
    if raw is None:
        return None
    path = "runtime.wandb"
    raw = f.mapping(path, raw, WANDB_KEYS)
    if "project" not in raw:
        raise ConfigError(f.join(path, "project"), None, "missing: the wandb project to log to")
    return WandbOptions(f.name(f.join(path, "project"), raw["project"]),
                        f.path(f.join(path, "name"), raw.get("name", "")),
                        f.choice(f.join(path, "mode"), raw.get("mode", "online"), WANDB_MODES))


def parse_outputs(raw: Mapping[str, Any]) -> OutputOptions:
    """The output keys of an already key-checked ``runtime:`` mapping."""
    log_samples = f.non_negative_int("runtime.log_samples", raw.get("log_samples", 4))
    if log_samples > MAX_LOG_SAMPLES:
        raise ConfigError("runtime.log_samples", log_samples,
                          f"must be at most {MAX_LOG_SAMPLES:,} responses a step")
    return OutputOptions(
        val_every=f.non_negative_int("runtime.val_every", raw.get("val_every", 0), "MAX_STEPS"),
        val_samples=f.non_negative_int("runtime.val_samples", raw.get("val_samples", 0),
                                       "MAX_STEPS"),
        log_samples=log_samples,
        tensorboard=f.path("runtime.tensorboard", raw.get("tensorboard", "")),
        wandb=_wandb(raw.get("wandb")),
    )
