"""A submitit entry point that follows submitit's Checkpointable convention.

``NereusEntry(target)`` is what a user submits (``executor.submit(NereusEntry(...))``). Its
``__call__`` runs the target; on preemption or the time-limit warning submitit calls
``checkpoint()``, which asks a running command to checkpoint (SIGUSR1, then waits up to
``grace_s``) and returns a ``DelayedSubmission`` of the next attempt; submitit requeues it and the
next attempt runs the target again with ``resume_args`` appended (e.g. ``--resume``).

A target is either a command line (run with subprocess; its stdout/stderr go to the job's) or
``"package.module:function"`` (imported and called with ``args``; its return value is the
job's result). Until ``nereus run`` exists the tests use small real commands and callables.
"""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from nereus.errors import ConfigError, NereusError


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

    def __post_init__(self) -> None:
        if not self.target:
            raise ConfigError("entry.target", self.target, "needs a command or a callable path")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_proc"] = None  # a running child never travels with the pickle
        return state

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
        self._proc = subprocess.Popen(self.command())
        returncode = self._proc.wait()
        self._proc = None
        if returncode != 0:
            raise EntryCommandError(f"{' '.join(self.command())}: exit {returncode}")
        return returncode

    def stop_child(self) -> int | None:
        """Signal a running command to checkpoint and wait for it; its exit status or None."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        proc.send_signal(self.checkpoint_signal)
        try:
            return proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def next_attempt(self) -> NereusEntry:
        return replace(self, attempt=self.attempt + 1, _proc=None)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's hook: checkpoint the running target and resubmit the next attempt."""
        from submitit.helpers import DelayedSubmission

        self.stop_child()
        return DelayedSubmission(self.next_attempt(), *args, **kwargs)
