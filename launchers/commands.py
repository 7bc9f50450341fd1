"""Pure builders of the srun and mpiexec command lines that start the ranks of a Nereus job.

A ``LaunchSpec`` says what to run and where; ``srun_argv`` / ``mpiexec_argv`` turn it into an argv
tuple (no I/O, deterministic). Notes verified with Slurm 22.05 on emulated nodes:

- ``srun --mpi=pmi2`` (pmix fails across emulated nodes on one host).
- ``srun --no-kill``: when a node of the step fails only its tasks die; the others run on (srun
  still exits non-zero). Without it the whole step is force-terminated.
- After the allocation shrank, a new step must name its size (``--nodes``/``--ntasks``, here
  with ``--nodelist``): a bare ``srun`` takes SLURM_JOB_NUM_NODES from the environment, which
  never changes, and fails with "conflicts with allocated node count".
- Open MPI as root needs ``--allow-run-as-root --oversubscribe``; ULFM needs ``--with-ft ulfm``
  with ``--mca pml ob1 --mca btl tcp,self`` (it hangs with the shared-memory transport).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launchers.flags import slurm_flags
from nereus.errors import ConfigError

MPI_FLAVOURS = ("openmpi", "mpich")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class LaunchSpec:
    """What to start on each rank, how many ranks, and where.

    ``ntasks``/``nodes`` of None take the size of the enclosing allocation (srun) or every slot
    (mpiexec). ``nodelist`` pins the hosts (a relaunch on survivors). ``env`` is exported to every
    rank. ``cpu_bind`` is srun's ``--cpu-bind`` value ("none" also disables mpiexec binding; None
    omits it: a cluster with TaskPlugin=task/none warns about any --cpu-bind).
    """

    argv: tuple[str, ...]
    ntasks: int | None = None
    nodes: int | None = None
    ntasks_per_node: int | None = None
    nodelist: tuple[str, ...] = ()
    cpus_per_task: int | None = None
    gpus_per_task: int | None = None
    cpu_bind: str | None = "none"
    env: tuple[tuple[str, str], ...] = ()
    forward_env: tuple[str, ...] = ()
    no_kill: bool = True
    kill_on_bad_exit: bool = False
    label: bool = False
    mpi: str = "pmi2"
    ulfm: bool = False
    # mpiexec only: a shell variable holding the host list (``host:slots,...``) the batch script
    # computes (a heterogeneous job's hosts across its components); "" when unused
    hosts_var: str = ""
    mca: tuple[tuple[str, str], ...] = ()  # Open MPI only: extra ``--mca NAME VALUE`` pairs

    def __post_init__(self) -> None:
        if not self.argv:
            raise ConfigError("launch.argv", self.argv, "needs a program to run")
        for name, value in (("ntasks", self.ntasks), ("nodes", self.nodes),
                            ("ntasks_per_node", self.ntasks_per_node),
                            ("cpus_per_task", self.cpus_per_task),
                            ("gpus_per_task", self.gpus_per_task)):
            if value is not None and value < 1:
                raise ConfigError(f"launch.{name}", value, "must be a positive integer")
        if self.nodes is not None and self.nodelist and len(self.nodelist) != self.nodes:
            raise ConfigError("launch.nodelist", self.nodelist,
                              f"names {len(self.nodelist)} hosts but nodes={self.nodes}")
        if self.hosts_var and (self.nodelist or not _ENV_NAME.match(self.hosts_var)):
            raise ConfigError("launch.hosts_var", self.hosts_var,
                              "must be a shell variable name, without nodelist")
        for name in self.forward_env:
            if not _ENV_NAME.match(name):
                raise ConfigError("launch.forward_env", name, "is not an environment variable name")
        for env_key, env_value in self.env:
            if not _ENV_NAME.match(env_key):
                raise ConfigError("launch.env", env_key, "is not an environment variable name")
            if "," in env_value:
                raise ConfigError(f"launch.env.{env_key}", env_value,
                                  "must not contain ',' (srun --export separates with commas)")


def _slots_per_host(spec: LaunchSpec) -> int:
    if spec.ntasks_per_node is not None:
        return spec.ntasks_per_node
    if spec.ntasks is not None and spec.nodelist:
        return -(-spec.ntasks // len(spec.nodelist))
    return 1


def srun_flags(spec: LaunchSpec) -> list[str]:
    """srun's flags for ``spec`` (:func:`launchers.flags.slurm_flags`)."""
    nodes = spec.nodes if spec.nodes is not None else (len(spec.nodelist) or None)
    pairs: list[tuple[str, object]] = [
        ("mpi", spec.mpi), ("ntasks", spec.ntasks), ("nodes", nodes),
        ("ntasks_per_node", spec.ntasks_per_node),
        ("nodelist", ",".join(spec.nodelist) or None), ("cpus_per_task", spec.cpus_per_task),
        ("gpus_per_task", spec.gpus_per_task), ("cpu_bind", spec.cpu_bind),
        ("kill_on_bad_exit", 1 if spec.kill_on_bad_exit else 0), ("no_kill", spec.no_kill),
        ("label", spec.label),
        ("export", ("ALL," + ",".join(f"{k}={v}" for k, v in spec.env)) if spec.env else None),
    ]
    return slurm_flags(pairs)


def srun_argv(spec: LaunchSpec) -> tuple[str, ...]:
    """``srun`` for one job step of the ranks (inside an allocation)."""
    return ("srun", *srun_flags(spec), *spec.argv)


def mpiexec_argv(spec: LaunchSpec, flavour: str = "openmpi") -> tuple[str, ...]:
    """``mpiexec`` for Open MPI (with the TCP transport ULFM needs) or MPICH (hydra)."""
    if flavour not in MPI_FLAVOURS:
        raise ConfigError("launch.mpi_flavour", flavour, f"must be one of {MPI_FLAVOURS}")
    if flavour == "mpich" and (spec.ulfm or spec.mca):
        if spec.mca:
            raise ConfigError("launch.mca", spec.mca, "Open MPI's flags (MPICH has no --mca)")
        raise ConfigError("launch.ulfm", True, "ULFM needs Open MPI (MPICH's did not work)")
    slots = _slots_per_host(spec)
    hosts = ",".join(f"{host}:{slots}" for host in spec.nodelist)
    if spec.hosts_var:
        hosts = f"${spec.hosts_var}"
    argv: list[str] = ["mpiexec"]
    if flavour == "openmpi":
        argv += ["--allow-run-as-root", "--oversubscribe"]
        if spec.ntasks is not None:
            argv += ["-n", str(spec.ntasks)]
        if hosts:
            argv += ["--host", hosts]
        if spec.ntasks_per_node is not None and not hosts:
            argv += ["--map-by", f"ppr:{spec.ntasks_per_node}:node"]
        argv += ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"]
        for name, value in spec.mca:
            argv += ["--mca", name, value]
        if spec.ulfm:
            argv += ["--with-ft", "ulfm"]
        if spec.cpu_bind == "none":
            argv += ["--bind-to", "none"]
        for key, value in spec.env:
            argv += ["-x", f"{key}={value}"]
        for name in spec.forward_env:
            argv += ["-x", name]
    else:
        if spec.ntasks is not None:
            argv += ["-n", str(spec.ntasks)]
        if hosts:
            argv += ["-hosts", hosts]
        elif spec.ntasks_per_node is not None:
            argv += ["-ppn", str(spec.ntasks_per_node)]
        if spec.cpu_bind == "none":
            argv += ["-bind-to", "none"]
        for key, value in spec.env:
            argv += ["-genv", key, value]
        if spec.forward_env:
            argv += ["-envlist", ",".join(spec.forward_env)]
    return (*argv, *spec.argv)

