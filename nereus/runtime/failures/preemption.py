"""Preemption: the scheduler's warning signal → a checkpoint → exit for requeue (effectful).

Slurm warns a job before it ends it: ``--signal=B:USR1@N`` (the sbatch templates; the batch shell
forwards it to the launcher, which forwards it to every rank), submitit's ``--signal=USR2@90``
(every process of the step), and SIGTERM at preemption or ``scancel`` (``KillWait`` seconds, 30
by default, before SIGKILL). Every rank of ``nereus run`` takes them the same way:

- **USR1, USR2** — a *warning*: the deadline is ``runtime.failures.warning_s`` away. Rank 0 stops
  the job at the next step boundary: the ``step`` message that starts the next step says
  ``stop`` instead, so every rank stops at the same boundary; the ranks gather the state of that
  boundary, rank 0 writes it as a checkpoint (:func:`nereus.runtime.failures.checkpoint.
  save_global`: parameters, Adam state, counters with the data position, the controller and its
  calibration, the run's record so far), logs ``preempted`` and every rank exits with
  :data:`EXIT_PREEMPTED`.
- **TERM, ALRM** — the end is near: the deadline is ``runtime.failures.kill_wait_s`` away
  (``nereus run`` turns a SIGTERM it gets into SIGALRM for the ranks, as Open MPI's ``mpiexec``
  ends the ranks on a SIGTERM of its own but forwards SIGALRM).

When the step in flight cannot end before the deadline — this rank's estimate of the rest of the
step (the last step's time on this rank less what already ran) and of the checkpoint does not fit
— or when the boundary's checkpoint has not been written shortly before the deadline, the rank
*abandons* the step: a thread writes this rank's shards of its last two safe boundaries
(:class:`nereus.runtime.failures.boundary.BoundaryBook`; no collective, no peer needed) to
``<checkpoint dir>/dump-<segment>/`` and the process exits with :data:`EXIT_PREEMPTED`. Ranks
stuck in a collective with an abandoning peer reach the same point at their own deadline. The
resume takes the newest boundary whose every model-stage has one replica all of whose ranks wrote
their shards (:func:`nereus.runtime.failures.dumps.boundaries_of`), or the newest global
checkpoint, whichever is newer — of the files usable for this job
(:mod:`nereus.runtime.failures.resume_check`).

Exit status :data:`EXIT_PREEMPTED` = 75 (``EX_TEMPFAIL``, "try again later"): ``nereus run``
exits with it after a preemption; the sbatch templates run ``scontrol requeue`` on it (a site may
also list it in ``slurm.conf``'s ``RequeueExit``), and :class:`launchers.submitit_entry.
NereusEntry` resubmits the job with ``--resume``.

Signals are taken by a thread that waits for them (``sigwait``) while every other thread of the
rank — torch's, gloo's, Open MPI's — has them blocked (:meth:`PreemptWatch.install` runs before
any of those threads exists), so a signal never interrupts a collective or an HDF5 write.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

EXIT_PREEMPTED = 75  # sysexits EX_TEMPFAIL
WARNINGS = (signal.SIGUSR1, signal.SIGUSR2)
URGENT = (signal.SIGTERM, signal.SIGALRM)
SIGNALS = (*WARNINGS, *URGENT)
DUMP_MARGIN_S = 3.0  # written this long before the deadline at the latest
CHECKPOINT_S = 2.0  # first estimate of a boundary checkpoint, before one was measured


@dataclass(frozen=True)
class Notice:
    """The first preemption signal a rank got: its name, when, and the deadline it sets."""

    signal: str
    at_unix_s: float
    deadline_unix_s: float

    def to_dict(self) -> dict[str, object]:
        return {"signal": self.signal, "at_unix_s": self.at_unix_s,
                "deadline_unix_s": self.deadline_unix_s}


class PreemptWatch:
    """One rank's watch for preemption signals (see the module docstring)."""

    def __init__(self) -> None:
        self.notice: Notice | None = None
        self.warning_s = 60.0
        self.kill_wait_s = 30.0
        self._lock = threading.Lock()
        self._done = threading.Event()  # the boundary checkpoint was written: no dump
        self._wake = threading.Event()
        self._dump: Callable[[str], None] | None = None
        self._step_t0 = 0.0  # perf_counter at the start of the step in flight (0: none)
        self._step_s = 0.0  # this rank's last step time
        self._checkpoint_s = CHECKPOINT_S
        self.installed = False

    # -- set-up ------------------------------------------------------------------------------

    def install(self) -> None:
        """Block the signals in this thread (and every thread started from now on) and start
        the thread that takes them. Call before torch, MPI or gloo start threads."""
        if self.installed or threading.current_thread() is not threading.main_thread():
            return
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        threading.Thread(target=self._wait_signals, name="nereus-preempt", daemon=True).start()
        threading.Thread(target=self._deadline, name="nereus-preempt-deadline",
                         daemon=True).start()
        self.installed = True

    def configure(self, warning_s: float, kill_wait_s: float) -> None:
        self.warning_s, self.kill_wait_s = warning_s, kill_wait_s

    def on_abandon(self, dump: Callable[[str], None]) -> None:
        """``dump(reason)`` writes this rank's boundary shards (called from the watch thread)."""
        self._dump = dump

    # -- what the step loop tells ------------------------------------------------------------

    @property
    def requested(self) -> bool:
        return self.notice is not None

    def step_started(self) -> None:
        self._step_t0 = time.perf_counter()
        self._wake.set()

    def step_ended(self, seconds: float) -> None:
        self._step_s, self._step_t0 = seconds, 0.0

    def checkpoint_took(self, seconds: float) -> None:
        self._checkpoint_s = max(seconds, 0.1)

    def done(self) -> None:
        """The boundary checkpoint is written: the thread must not dump any more."""
        with self._lock:
            self._done.set()

    # -- the threads -------------------------------------------------------------------------

    def _wait_signals(self) -> None:
        while True:
            sig = signal.sigwait(SIGNALS)
            now = time.time()
            wait_s = self.warning_s if sig in WARNINGS else self.kill_wait_s
            name = signal.Signals(sig).name
            with self._lock:
                old = self.notice
                if old is None or now + wait_s < old.deadline_unix_s:
                    first = old.signal if old else name
                    self.notice = Notice(first if old else name, old.at_unix_s if old else now,
                                         now + wait_s)
            print(f"nereus: rank {os.environ.get('OMPI_COMM_WORLD_RANK', '?')} got {name}: "
                  f"checkpoint by {wait_s:g} s from now", file=sys.stderr, flush=True)
            self._wake.set()

    def _deadline(self) -> None:
        """Abandon the step in flight when it cannot end (and its boundary be written) before
        the deadline; at the latest :data:`DUMP_MARGIN_S` before it."""
        while True:
            self._wake.wait(1.0)
            self._wake.clear()
            notice = self.notice
            if notice is None or self._done.is_set():
                continue
            left = notice.deadline_unix_s - time.time()
            rest = 0.0
            if self._step_t0 and self._step_s:
                rest = max(0.0, self._step_s - (time.perf_counter() - self._step_t0))
            if left <= DUMP_MARGIN_S:
                self._abandon(f"{left:.1f} s before the deadline, the boundary's checkpoint "
                              "is not written")
            elif self._step_t0 and rest + self._checkpoint_s + DUMP_MARGIN_S > left:
                self._abandon(f"the step in flight needs about {rest:.1f} s more and its "
                              f"checkpoint {self._checkpoint_s:.1f} s; {left:.1f} s are left")

    def _abandon(self, reason: str) -> None:
        with self._lock:
            if self._done.is_set():
                return
            if self._dump is not None:
                try:
                    self._dump(reason)
                except Exception as e:  # the exit below is what matters now
                    print(f"nereus: preemption dump failed: {type(e).__name__}: {e}",
                          file=sys.stderr, flush=True)
            with contextlib.suppress(Exception):
                sys.stderr.flush()
                sys.stdout.flush()
            os._exit(EXIT_PREEMPTED)
