"""The one place that reads the job environment (SLURM_*, OMPI_*, PMI_*, MASTER_ADDR, ...).

``parse_job_environment(mapping)`` is pure; ``from_os_environ()`` is the thin effectful wrapper.
Rank precedence: Open MPI's OMPI_COMM_WORLD_* (mpiexec, also under Slurm) > PMI_RANK/PMI_SIZE
(srun --mpi=pmi2, MPICH hydra) > SLURM_PROCID inside a job step (SLURM_STEP_ID set; the batch
shell also carries SLURM_PROCID=0) > torchrun's RANK/WORLD_SIZE > a single process.

Slurm 22.05 does not export ``--no-kill`` into the job; ``SLURM_NO_KILL`` is an *input* variable
(accepted values "set"/"on", not "1") that our sbatch templates export so every srun step inherits it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from nereus.cluster.slurm_watch import expand_nodes
from nereus.errors import ConfigError

_NO_KILL_ON = ("", "set", "on")


@dataclass(frozen=True)
class JobEnvironment:
    """Who this process is in the job and what allocation it runs in."""

    launcher: str  # "openmpi" | "pmi" | "srun" | "torchrun" | "none"
    global_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int | None
    node_name: str | None
    slurm_job_id: str | None
    slurm_step_id: str | None
    job_nodes: tuple[str, ...]  # SLURM_JOB_NODELIST at start: never updated by Slurm
    step_nodes: tuple[str, ...]
    cpus_on_node: int | None
    restart_count: int  # SLURM_RESTART_COUNT: times the job was requeued
    no_kill: bool
    submit_dir: str | None
    master_addr: str | None
    master_port: int | None
    cuda_visible_devices: str | None
    rocr_visible_devices: str | None

    @property
    def in_slurm(self) -> bool:
        return self.slurm_job_id is not None

    @property
    def is_controller(self) -> bool:
        return self.global_rank == 0


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(name, raw, "must be an integer") from None
    if value < 0:
        raise ConfigError(name, raw, "must not be negative")
    return value


def _req(value: int | None, name: str) -> int:
    if value is None:
        raise ConfigError(name, None, "must be set")
    return value


def _ranks(env: Mapping[str, str]) -> tuple[str, int, int, int, int]:
    """(launcher, global_rank, world_size, local_rank, local_world_size)."""
    if "OMPI_COMM_WORLD_RANK" in env:
        rank = _req(_int(env, "OMPI_COMM_WORLD_RANK"), "OMPI_COMM_WORLD_RANK")
        size = _req(_int(env, "OMPI_COMM_WORLD_SIZE"), "OMPI_COMM_WORLD_SIZE")
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0) or 0
        local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1) or 1
        return "openmpi", rank, size, local, local_size
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        rank = _req(_int(env, "PMI_RANK"), "PMI_RANK")
        size = _req(_int(env, "PMI_SIZE"), "PMI_SIZE")
        local_id = _int(env, "MPI_LOCALRANKID", None)
        local = local_id if local_id is not None else (_int(env, "SLURM_LOCALID", 0) or 0)
        local_size = _int(env, "MPI_LOCALNRANKS", None) or _local_tasks(env) or 1
        return "pmi", rank, size, local, local_size
    if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env:
        rank = _req(_int(env, "SLURM_PROCID"), "SLURM_PROCID")
        size = _req(_int(env, "SLURM_NTASKS", _int(env, "SLURM_STEP_NUM_TASKS")), "SLURM_NTASKS")
        local = _int(env, "SLURM_LOCALID", 0) or 0
        return "srun", rank, size, local, _local_tasks(env) or 1
    if "RANK" in env and "WORLD_SIZE" in env:
        rank = _req(_int(env, "RANK"), "RANK")
        size = _req(_int(env, "WORLD_SIZE"), "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK", 0) or 0
        local_size = _int(env, "LOCAL_WORLD_SIZE", 1) or 1
        return "torchrun", rank, size, local, local_size
    return "none", 0, 1, 0, 1


def _local_tasks(env: Mapping[str, str]) -> int | None:
    """Tasks on this node from SLURM_STEP_TASKS_PER_NODE ("2(x3),1") and SLURM_NODEID."""
    raw = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node_id = _int(env, "SLURM_NODEID")
    if not raw or node_id is None:
        return None
    counts: list[int] = []
    for part in raw.split(","):
        count, _, rest = part.partition("(x")
        try:
            counts += [int(count)] * (int(rest.rstrip(")")) if rest else 1)
        except ValueError:
            raise ConfigError("SLURM_STEP_TASKS_PER_NODE", raw, "must look like '2(x3),1'") from None
    return counts[node_id] if node_id < len(counts) else None


def parse_job_environment(env: Mapping[str, str]) -> JobEnvironment:
    """Parse a process environment (pure). Raises ConfigError naming the bad variable."""
    launcher, rank, size, local, local_size = _ranks(env)
    if size < 1 or rank >= size:
        raise ConfigError("rank", rank, f"must be below the world size {size}")
    no_kill_raw = env.get("SLURM_NO_KILL")
    step_id = env.get("SLURM_STEP_ID") or None
    return JobEnvironment(
        launcher=launcher, global_rank=rank, world_size=size, local_rank=local,
        local_world_size=local_size,
        node_rank=_int(env, "SLURM_NODEID") if step_id is not None else None,
        node_name=env.get("SLURMD_NODENAME") or None,
        slurm_job_id=env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or None,
        slurm_step_id=step_id,
        job_nodes=expand_nodes(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")),
        step_nodes=expand_nodes(env.get("SLURM_STEP_NODELIST", "")),
        cpus_on_node=_int(env, "SLURM_CPUS_ON_NODE"),
        restart_count=_int(env, "SLURM_RESTART_COUNT", 0) or 0,
        no_kill=no_kill_raw is not None and no_kill_raw.strip().lower() in _NO_KILL_ON,
        submit_dir=env.get("SLURM_SUBMIT_DIR") or None,
        master_addr=env.get("MASTER_ADDR") or None,
        master_port=_int(env, "MASTER_PORT"),
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        rocr_visible_devices=env.get("ROCR_VISIBLE_DEVICES") or env.get("HIP_VISIBLE_DEVICES"),
    )


def from_os_environ() -> JobEnvironment:
    """The job environment of this process."""
    return parse_job_environment(os.environ)


# Handed from ``nereus run`` (a Slurm task) to the ranks it starts with mpiexec, whose
# environment must not carry SLURM_* (mpiexec would then ask srun for its daemons).
WATCH_JOB, WATCH_CONF, WATCH_NODES = "NEREUS_WATCH_SLURM_JOB", "NEREUS_WATCH_SLURM_CONF", \
    "NEREUS_WATCH_SLURM_NODES"


def watch_variables(env: Mapping[str, str]) -> dict[str, str]:
    """What the ranks need to watch this Slurm job (job id, slurm.conf, step nodes), or {}."""
    job = parse_job_environment(env)
    if not job.slurm_job_id:
        return {}
    out = {WATCH_JOB: job.slurm_job_id, WATCH_NODES: ",".join(job.step_nodes or job.job_nodes)}
    if env.get("SLURM_CONF"):
        out[WATCH_CONF] = env["SLURM_CONF"]
    return out


@dataclass(frozen=True)
class WatchTarget:
    """The Slurm job whose allocation a rank watches, its nodes in rank order, and the
    environment Slurm's commands need (``SLURM_CONF`` of a non-default cluster)."""

    job_id: str
    nodes: tuple[str, ...]
    command_env: tuple[tuple[str, str], ...]


def watch_target(env: Mapping[str, str]) -> WatchTarget | None:
    """From the variables :func:`watch_variables` handed over, or this process's own Slurm job."""
    if env.get(WATCH_JOB):
        job_id, nodes = env[WATCH_JOB], tuple(n for n in env.get(WATCH_NODES, "").split(",") if n)
        conf = env.get(WATCH_CONF, "")
    else:
        job = parse_job_environment(env)
        if not job.slurm_job_id:
            return None
        job_id, nodes, conf = job.slurm_job_id, job.step_nodes or job.job_nodes, \
            env.get("SLURM_CONF", "")
    command_env = {k: v for k, v in env.items() if not k.startswith("NEREUS_WATCH_")}
    if conf:
        command_env["SLURM_CONF"] = conf
    return WatchTarget(job_id, nodes, tuple(sorted(command_env.items())))


def host_cores() -> int:
    """The CPUs this process may run on (its affinity), e.g. the cores that ``nereus run``'s
    local CPU ranks share."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
