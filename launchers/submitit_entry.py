"""A submitit entry point that follows submitit's Checkpointable convention.

``NereusEntry(target)`` is what a user submits (``executor.submit(NereusEntry(...))``). Its
``__call__`` runs the target; on preemption or the time-limit warning submitit calls
``checkpoint()``, which asks a running command to checkpoint (SIGUSR1, then waits up to
``grace_s``) and returns a ``DelayedSubmission`` of the next attempt; submitit requeues it and the
next attempt runs the target again with ``resume_args`` appended (e.g. ``--resume``).

A target is either a command line (run with subprocess; its stdout/stderr go to the job's) or
``"package.module:function"`` (imported and called with ``args``; its return value is the
job's result). :meth:`NereusEntry.nereus_run` is the entry of a ``nereus run`` job: the
command with this Python; SIGUSR1 makes it checkpoint at the next step boundary and exit 75
(:mod:`nereus.runtime.failures.preemption`), and the next attempt continues the same log with
``--resume``.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from nereus.errors import ConfigError, NereusError

PREEMPTED = 75  # nereus run's exit status after a preemption checkpoint (EX_TEMPFAIL)


class EntryCommandError(NereusError):
    """The target command exited with a non-zero status."""


def resolve_callable(path: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError("entry.target", path, "must look like 'package.module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError("entry.target", path, f"cannot be imported ({exc})") from None
    if not callable(obj):
        raise ConfigError("entry.target", path, "is not callable")
    return obj


@dataclass
class NereusEntry:
    """One submitit job: a command line (tuple) or a callable path (str), resumable."""

    target: tuple[str, ...] | str
    args: tuple[Any, ...] = ()
    resume_args: tuple[str, ...] = ("--resume",)
    attempt: int = 0
    grace_s: float = 60.0
    checkpoint_signal: int = int(signal.SIGUSR1)
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)
    _exited: threading.Event | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.target:
            raise ConfigError("entry.target", self.target, "needs a command or a callable path")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_proc"] = state["_exited"] = None  # a running child never travels along
        return state

    @classmethod
    def nereus_run(cls, config: str, *args: str, grace_s: float = 60.0) -> NereusEntry:
        """``nereus run CONFIG ARGS`` as a submitit job (with the submitting Python: the job
        runs on the same installation). Give ``--log PATH`` in ``args`` to name the log;
        without it the log is ``nereus-run-<job id>.h5`` in the job's directory — a requeued
        job keeps its id, so either way the next attempt finds the log and its checkpoint.
        ``grace_s``: how long :meth:`checkpoint` waits for the checkpoint (submitit's
        ``USR2@90`` leaves 90 s; ``runtime.failures.warning_s`` is what the ranks allow
        themselves, 60 s by default)."""
        return cls((sys.executable, "-m", "nereus", "run", config, *args), grace_s=grace_s)

    def command(self) -> tuple[str, ...]:
        """The argv this attempt runs (command targets only)."""
        if isinstance(self.target, str):
            raise ConfigError("entry.target", self.target, "is a callable, not a command")
        extra = self.resume_args if self.attempt > 0 else ()
        return (*self.target, *(str(a) for a in self.args), *extra)

    def __call__(self) -> Any:
        if isinstance(self.target, str):
            return resolve_callable(self.target)(*self.args)
        sys.stdout.flush()
        proc = subprocess.Popen(self.command())
        # A thread reaps the child: submitit runs checkpoint() in a signal handler on this
        # thread, and Popen.wait() there would deadlock against a wait() it interrupted.
        self._proc, self._exited = proc, threading.Event()
        threading.Thread(target=self._reap, args=(proc, self._exited), daemon=True).start()
        while not self._exited.wait(0.2):
            pass
        self._proc = None
        if proc.returncode == PREEMPTED:  # checkpointed on a signal that was not submitit's
            raise EntryCommandError(f"{' '.join(self.command())}: preempted (exit 75); its "
                                    "checkpoint is written: resubmit this entry's next_attempt()")
        if proc.returncode != 0:
            raise EntryCommandError(f"{' '.join(self.command())}: exit {proc.returncode}")
        return proc.returncode

    @staticmethod
    def _reap(proc: subprocess.Popen[bytes], exited: threading.Event) -> None:
        proc.wait()
        exited.set()

    def stop_child(self) -> int | None:
        """Ask a running command to checkpoint (signal, wait ``grace_s``, then kill).

        Returns its exit status, or None when no command is running. ``nereus run`` takes
        SIGUSR1 and SIGUSR2 alike as "checkpoint at the next step boundary and exit 75": on
        Slurm the scheduler's signal reaches every process of the step, the child included.
        """
        proc, exited = self._proc, self._exited
        if proc is None or exited is None:
            return None
        if not exited.is_set():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(self.checkpoint_signal)
            if not exited.wait(self.grace_s):
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                exited.wait(10.0)
        return proc.returncode

    def next_attempt(self) -> NereusEntry:
        return replace(self, attempt=self.attempt + 1, _proc=None, _exited=None)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's hook: checkpoint the running target and resubmit the next attempt."""
        from submitit.helpers import DelayedSubmission

        self.stop_child()
        return DelayedSubmission(self.next_attempt(), *args, **kwargs)


def submitit_parameters() -> dict[str, Any]:
    """``executor.update_parameters(**submitit_parameters())``: the same elastic launch as the
    sbatch templates (allocation and steps survive a node failure; PMI2; no kill on a bad exit).
    submitit keeps its own ``--signal=USR2@90`` and requeue handling."""
    from launchers.flags import slurm_flags

    return {
        # submitit renders these with its own _as_sbatch_flag: the same spelling as ours
        "slurm_additional_parameters": {"no_kill": True},
        "slurm_srun_args": slurm_flags([("mpi", "pmi2"), ("no_kill", True),
                                        ("kill_on_bad_exit", 0)]),
        "slurm_setup": ["export SLURM_NO_KILL=set"],
    }
