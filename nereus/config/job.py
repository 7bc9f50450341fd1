"""The ``job:`` and ``controller:`` sections and the rules that tie the job to its models."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nereus.config import fields as f
from nereus.errors import ConfigError
from nereus.spec.job import PIPELINE_SPLITS, ControllerSpec, JobSpec, PlanSpace
from nereus.spec.model import ModelSpec
from nereus.spec.workflow import ALGORITHMS, MODES

JOB_KEYS = (
    "algorithm", "mode", "global_batch", "samples_per_prompt", "minibatches", "prompt_len",
    "gen_len", "gen_len_p95", "reward_model", "actor_inf", "dtype_bytes", "static_batches",
    "flash_attention", "distributed_optimizer", "pipeline_split", "uneven_dp",
)
DEFAULT_SAMPLES_PER_PROMPT = {"ppo": 1, "grpo": 8, "remax": 1}
DTYPE_BYTES = (2, 4)  # bf16/fp16, fp32


@dataclass(frozen=True)
class JobFields:
    """The checked scalar fields of ``job:`` (everything but the models)."""

    algorithm: str = "ppo"
    mode: str = "sync"
    global_batch: int = 256
    samples_per_prompt: int = 1
    minibatches: int = 1
    prompt_len: int = 1024
    gen_len: int = 2048
    gen_len_p95: int = 0
    reward_model: bool = True
    actor_inf: bool = False
    dtype_bytes: int = 2
    static_batches: bool = False
    flash_attention: bool = True
    distributed_optimizer: bool = False
    pipeline_split: str = "uneven"
    uneven_dp: bool = True


def _dtype_bytes(path: str, value: Any) -> int:
    if isinstance(value, bool) or value not in DTYPE_BYTES:
        raise ConfigError(path, value, "must be 2 (bf16/fp16) or 4 (fp32)")
    return int(value)


_JOB_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "algorithm": lambda p, v: f.choice(p, v, ALGORITHMS),
    "mode": lambda p, v: f.choice(p, v, MODES),
    "global_batch": f.positive_int,
    "samples_per_prompt": f.positive_int,
    "minibatches": f.positive_int,
    "prompt_len": lambda p, v: f.positive_int(p, v, "MAX_TOKENS"),
    "gen_len": lambda p, v: f.positive_int(p, v, "MAX_TOKENS"),
    "gen_len_p95": lambda p, v: f.non_negative_int(p, v, "MAX_TOKENS"),
    "reward_model": f.boolean,
    "actor_inf": f.boolean,
    "dtype_bytes": _dtype_bytes,
    "static_batches": f.boolean,
    "flash_attention": f.boolean,
    "distributed_optimizer": f.boolean,
    "pipeline_split": lambda p, v: f.choice(p, v, PIPELINE_SPLITS),
    "uneven_dp": f.boolean,
}


def parse_job_fields(raw: Any, path: str = "job") -> JobFields:
    """Type and range checks of every ``job:`` field, plus the rules among them."""
    raw = f.mapping(path, raw, JOB_KEYS)
    values = {k: _JOB_CHECKS[k](f.join(path, k), v) for k, v in raw.items()}
    algorithm = values.get("algorithm", JobFields.algorithm)
    values.setdefault("samples_per_prompt", DEFAULT_SAMPLES_PER_PROMPT[algorithm])
    job = JobFields(**values)
    if job.algorithm == "grpo" and job.samples_per_prompt < 2:
        raise ConfigError(
            f.join(path, "samples_per_prompt"), job.samples_per_prompt,
            "grpo needs a group of at least 2 samples per prompt",
        )
    sequences = job.global_batch * job.samples_per_prompt
    if sequences % job.minibatches:
        raise ConfigError(
            f.join(path, "minibatches"), job.minibatches,
            f"must divide global_batch × samples_per_prompt = {sequences}",
        )
    if job.gen_len_p95 and job.gen_len_p95 < job.gen_len:
        raise ConfigError(
            f.join(path, "gen_len_p95"), job.gen_len_p95,
            f"must be 0 (same as gen_len) or at least gen_len={job.gen_len}",
        )
    return job


def check_lengths(
    job: JobFields, models: tuple[tuple[str, ModelSpec], ...], path: str = "job"
) -> None:
    """Prompt plus p95 generation must fit every model's maximum sequence length."""
    tokens = job.prompt_len + (job.gen_len_p95 or job.gen_len)
    key = "gen_len_p95" if job.gen_len_p95 else "gen_len"
    for role, spec in models:
        if tokens > spec.max_seq_len:
            raise ConfigError(
                f.join(path, key), getattr(job, key),
                f"prompt_len + {key} = {tokens} tokens exceeds max_seq_len={spec.max_seq_len} "
                f"of models.{role} ({spec.name})",
            )


CONTROLLER_KEYS = (
    "delta_len", "delta_efficiency", "gamma", "memory_headroom", "calibration_alpha",
    "horizon_alpha", "model_error", "targets", "host_staging", "loss_exposure",
)
_CONTROLLER_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "delta_len": f.positive_float,
    "delta_efficiency": f.positive_float,
    "gamma": f.non_negative_float,
    "memory_headroom": lambda p, v: f.fraction(p, v, closed_low=True, closed_high=False),
    "calibration_alpha": lambda p, v: f.fraction(p, v, closed_low=False, closed_high=True),
    "horizon_alpha": lambda p, v: f.fraction(p, v, closed_low=False, closed_high=True),
    "model_error": lambda p, v: f.fraction(p, v, closed_low=True, closed_high=False),
    "targets": lambda p, v: f.positive_int(p, v, "MAX_TARGETS"),
    "host_staging": f.boolean,
    "loss_exposure": f.boolean,
}


def parse_controller(raw: Any, path: str = "controller") -> ControllerSpec:
    raw = f.mapping(path, raw, CONTROLLER_KEYS)
    return ControllerSpec(**{k: _CONTROLLER_CHECKS[k](f.join(path, k), v) for k, v in raw.items()})


def build_job(
    job: JobFields,
    models: tuple[tuple[str, ModelSpec], ...],
    controller: ControllerSpec,
) -> JobSpec:
    return JobSpec(
        algorithm=job.algorithm,
        mode=job.mode,
        models=models,
        global_batch=job.global_batch,
        prompt_len=job.prompt_len,
        gen_len=job.gen_len,
        gen_len_p95=job.gen_len_p95,
        samples_per_prompt=job.samples_per_prompt,
        minibatches=job.minibatches,
        dtype_bytes=job.dtype_bytes,
        reward_model=job.reward_model,
        actor_inf=job.actor_inf,
        static_batches=job.static_batches,
        controller=controller,
        space=PlanSpace(pipeline=job.pipeline_split, uneven_dp=job.uneven_dp),
        flash_attention=job.flash_attention,
        distributed_optimizer=job.distributed_optimizer,
    )
