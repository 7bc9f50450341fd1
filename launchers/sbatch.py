"""A pure sbatch-script builder (``sbatch_script``) and one thin call that submits (``submit``).

The script a ``SbatchSpec`` describes:

- ``#SBATCH --no-kill`` and ``export SLURM_NO_KILL=set``: a failed node shrinks the allocation
  instead of ending it, and every srun step inherits no-kill (Slurm 22.05 reads SLURM_NO_KILL as
  an input variable; "set"/"on" work, "1" does not).
- ``#SBATCH --signal=B:USR1@120``: Slurm sends SIGUSR1 to the batch shell 120 s before the time
  limit. The shell forwards it to the launcher (srun and mpiexec pass it on to every rank), waits
  for the ranks to checkpoint and exit, then ``scontrol requeue``s the job (``--requeue``); so
  it does when ``nereus run`` exits 75 (preempted, its checkpoint written). SIGTERM
  (preemption, scancel) is forwarded as is; the requeued job resumes by itself
  (``SLURM_RESTART_COUNT`` > 0, same job id, same default log).
- the launcher runs in the background so the shell can take signals while it waits.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

from launchers.commands import LaunchSpec, mpiexec_argv, srun_argv
from launchers.flags import slurm_flags
from nereus.errors import ConfigError, NereusError

# "direct" runs the argv in the batch shell itself (a driver that starts its own srun steps).
LAUNCHERS = ("srun", "openmpi", "mpich", "direct")
_SHELL_VAR = re.compile(r"^\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*|@)$")
_POSITIONAL = re.compile(r"^[A-Z][A-Z0-9_]*$")


class SubmitError(NereusError):
    """sbatch refused the script or printed no job id."""


@dataclass(frozen=True)
class HetComponent:
    """One component of a heterogeneous job (``#SBATCH hetjob`` separates them): its partition
    and shape."""

    partition: str
    nodes: int
    ntasks_per_node: int
    cpus_per_task: int | None = None
    gpus_per_node: int | None = None

    def pairs(self) -> list[tuple[str, object]]:
        return [("partition", self.partition), ("nodes", self.nodes),
                ("ntasks_per_node", self.ntasks_per_node), ("gpus_per_node", self.gpus_per_node),
                ("cpus_per_task", self.cpus_per_task)]


@dataclass(frozen=True)
class SbatchSpec:
    """Directives, setup lines and the launch of one batch job.

    ``positional`` names the script's required arguments (``("CONFIG",)`` makes
    ``sbatch x.sbatch cfg.yaml`` set ``$CONFIG``; the rest stay in ``"$@"``). Words of
    ``launch.argv`` of the form ``$NAME`` or ``$@`` are shell expansions, double-quoted.
    """

    job_name: str
    launch: LaunchSpec
    launcher: str = "srun"
    nodes: int | None = None
    ntasks_per_node: int | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    time_limit: str | None = None
    partition: str | None = None
    output: str = "%x-%j.out"
    error: str | None = None  # None: stderr goes to ``output``
    no_kill: bool = True
    requeue: bool = True
    signal_warning: str | None = "B:USR1@120"
    extra_directives: tuple[str, ...] = ()
    setup_lines: tuple[str, ...] = ()
    positional: tuple[str, ...] = ()
    comment: tuple[str, ...] = ()
    # A heterogeneous job: one component per partition (``nodes``, ``partition`` and the shape
    # fields above stay unset; each component gives its own)
    components: tuple[HetComponent, ...] = ()

    def __post_init__(self) -> None:
        if self.components and any(v is not None for v in (
                self.nodes, self.ntasks_per_node, self.gpus_per_node, self.cpus_per_task,
                self.partition)):
            raise ConfigError("sbatch.components", len(self.components),
                              "a heterogeneous job gives nodes, tasks, CPUs, GPUs and partition "
                              "per component only")
        if self.launcher not in LAUNCHERS:
            raise ConfigError("sbatch.launcher", self.launcher, f"must be one of {LAUNCHERS}")
        if not re.match(r"^[A-Za-z0-9_.-]+$", self.job_name):
            raise ConfigError("sbatch.job_name", self.job_name, "letters, digits, '_.-' only")
        for name in self.positional:
            if not _POSITIONAL.match(name):
                raise ConfigError("sbatch.positional", name, "must be an UPPER_CASE shell name")
        if self.signal_warning is not None and not re.match(
                r"^(B:|R:)?(USR1|USR2|TERM|INT|URG)@[0-9]+$", self.signal_warning):
            raise ConfigError("sbatch.signal_warning", self.signal_warning,
                              "must look like 'B:USR1@120'")
        if self.requeue and self.signal_warning is not None and not (
                self.signal_warning.startswith("B:")):
            raise ConfigError("sbatch.signal_warning", self.signal_warning,
                              "must go to the batch shell ('B:') for requeue to work")


def shell_word(word: str) -> str:
    """Quote one word for bash; ``$NAME``/``${NAME}``/``$@`` stay expansions."""
    return f'"{word}"' if _SHELL_VAR.match(word) else shlex.quote(word)


def launch_argv(spec: SbatchSpec) -> tuple[str, ...]:
    if spec.launcher == "srun":
        return srun_argv(spec.launch)
    if spec.launcher == "direct":
        return spec.launch.argv
    return mpiexec_argv(spec.launch, spec.launcher)


def _directives(spec: SbatchSpec) -> list[str]:
    pairs: list[tuple[str, object]] = [
        ("job_name", spec.job_name), ("nodes", spec.nodes),
        ("ntasks_per_node", spec.ntasks_per_node), ("gpus_per_node", spec.gpus_per_node),
        ("cpus_per_task", spec.cpus_per_task), ("time", spec.time_limit),
        ("partition", spec.partition), ("output", spec.output), ("error", spec.error),
        ("open_mode", "append"),  # a requeued run appends to the same log
        ("no_kill", spec.no_kill), ("requeue", spec.requeue), ("no_requeue", not spec.requeue),
        ("signal", spec.signal_warning),
    ]
    lines = [f"#SBATCH {d}" for d in [*slurm_flags(pairs), *spec.extra_directives]]
    for i, comp in enumerate(spec.components):  # the first component's shape beside the job's
        if i:
            lines.append("#SBATCH hetjob")
        lines += [f"#SBATCH {d}" for d in slurm_flags(comp.pairs())]
    return lines


_BODY = """\
nereus_requeue=0
nereus_forward() {{
  echo "nereus: batch shell got SIG$1 (restart $restart_count): forwarding to the ranks" >&2
  [ "$1" = USR1 ] && nereus_requeue={requeue}
  kill -s "$1" "$launcher_pid" 2>/dev/null || true
}}
trap 'nereus_forward USR1' USR1
trap 'nereus_forward TERM' TERM

{launch} &
launcher_pid=$!
# wait returns early (status > 128) when a trapped signal arrives: wait again until it exits.
wait "$launcher_pid"; rc=$?
while kill -0 "$launcher_pid" 2>/dev/null; do wait "$launcher_pid"; rc=$?; done
# 75: nereus run was preempted and wrote its checkpoint (nereus.runtime.failures.preemption)
[ "$rc" = 75 ] && nereus_requeue={requeue}
if [ "$nereus_requeue" = 1 ]; then
  echo "nereus: ranks exited with $rc after the warning signal: requeueing job $SLURM_JOB_ID" >&2
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
exit "$rc"
"""


def sbatch_script(spec: SbatchSpec) -> str:
    """The complete batch script text (deterministic)."""
    lines = ["#!/bin/bash", *_directives(spec)]
    lines += [f"# {c}" if c else "#" for c in spec.comment]
    lines.append("set -uo pipefail")
    usage = " ".join(spec.positional + ("[ARGS...]",))
    for name in spec.positional:
        lines.append(f'{name}=${{1:?usage: sbatch $0 {usage}}}; shift')
    if spec.no_kill:
        lines.append("export SLURM_NO_KILL=set  # every srun step inherits --no-kill")
    if spec.cpus_per_task is not None and spec.launcher == "srun":
        # Slurm >= 22.05: srun does not inherit sbatch's --cpus-per-task (srun(1), sbatch(1)).
        lines.append('export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"')
    lines.append('restart_count="${SLURM_RESTART_COUNT:-0}"')
    lines += spec.setup_lines
    lines.append("")
    launch = " ".join(shell_word(w) for w in launch_argv(spec))
    body = _BODY.format(launch=launch, requeue=1 if spec.requeue else 0)
    return "\n".join(lines) + "\n" + body


def parse_job_id(stdout: str) -> str:
    """``sbatch --parsable`` prints ``JOBID`` or ``JOBID;CLUSTER``."""
    text = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id = text.split(";")[0].strip()
    if not job_id.isdigit():
        raise SubmitError(f"sbatch printed no job id: {stdout.strip()[:200]!r}")
    return job_id


def submit(script: str, args: tuple[str, ...] = (), *, cwd: str | None = None,
           env: Mapping[str, str] | None = None, extra_args: tuple[str, ...] = (),
           timeout_s: float = 30.0) -> str:
    """Submit ``script`` with ``sbatch --parsable``; ``args`` become the script's arguments.

    sbatch copies the script at submission, so it goes through a temporary file. Returns the
    job id.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".sbatch", dir=cwd) as handle:
        handle.write(script)
        handle.flush()
        argv = ["sbatch", "--parsable", *extra_args, handle.name, *args]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, cwd=cwd,
                                 env=dict(env) if env is not None else None,
                                 timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SubmitError(f"sbatch: {exc}") from None
    if res.returncode != 0:
        raise SubmitError(f"sbatch exit {res.returncode}: {res.stderr.strip()[:300]}")
    return parse_job_id(res.stdout)
