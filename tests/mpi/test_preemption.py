"""Preemption and resume of ``nereus run`` (real MPI ranks, real signals, real HDF5).

A running job gets the scheduler's signal through its launcher (``nereus run`` forwards it to
mpiexec, which forwards it to every rank): SIGUSR1 (Slurm's ``--signal=B:USR1@N`` warning) stops
every rank at the next step boundary and writes a checkpoint there; SIGTERM with a deadline too
close for the step in flight makes every rank abandon it and dump its shards of the last safe
boundaries. Either way the job exits 75 and ``nereus run --resume`` continues it in the same log,
to the same final parameters as an uninterrupted run, bit for bit (sync PPO on a fixed plan).
Runtime on 2 shared cores: about 2 minutes (five runs of 3 ranks).
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.preempt_runs import log_steps_and_events, run_and_signal, write_preempt_job

pytestmark = pytest.mark.skipif(shutil.which("mpiexec") is None,
                                reason="needs mpiexec (the mpi extra)")
STEPS = 8
PREEMPTED = 75


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("reference")
    cfg = write_preempt_job(tmp, "ref", STEPS)
    code, out = run_and_signal([str(cfg), "--log", str(tmp / "ref.h5")], None, 0)
    assert code == 0, out[-3000:]
    return np.load(tmp / "ref.npz")


def bit_exact(ref: Any, other: Any) -> None:
    assert set(ref.files) == set(other.files) and ref.files
    for k in ref.files:
        assert np.array_equal(ref[k], other[k]), k


def test_sigusr1_checkpoints_at_the_boundary_and_resume_is_bit_exact(
        tmp_path: Path, reference: Any) -> None:
    cfg = write_preempt_job(tmp_path, "run", STEPS)
    log = tmp_path / "run.h5"
    code, out = run_and_signal([str(cfg), "--log", str(log)], signal.SIGUSR1, 2)
    assert code == PREEMPTED, out[-3000:]
    assert "exit 75 for a requeue" in out
    assert not (tmp_path / "run.npz").exists()  # the run did not finish
    steps, events = log_steps_and_events(log)
    assert events[-1][0] == "preempted" and not events[-1][1]["abandoned"], events
    stop = events[-1][1]["step"]
    assert steps == list(range(stop)) and 2 <= stop < STEPS, (steps, stop)
    assert events[-1][1]["signal"] == "SIGUSR1"
    assert Path(events[-1][1]["checkpoint"]).name == f"step-{stop:08d}.npz"
    # a fresh run refuses the log; --resume continues it
    code, out = run_and_signal([str(cfg), "--log", str(log)], None, 0)
    assert code == 2 and "--resume" in out, out[-2000:]
    code, out = run_and_signal([str(cfg), "--log", str(log), "--resume"], None, 0)
    assert code == 0, out[-3000:]
    steps, events = log_steps_and_events(log)
    assert steps == list(range(STEPS))  # every step exactly once
    assert [k for k, _ in events] == ["preempted", "restart"]
    assert events[1][1]["step"] == stop
    bit_exact(reference, np.load(tmp_path / "run.npz"))


def test_sigterm_too_close_abandons_the_step_and_resumes_from_the_rank_dumps(
        tmp_path: Path, reference: Any) -> None:
    """kill_wait_s 2: less than the 3 s margin a rank keeps for its own dump, so every rank
    abandons what it is doing at once and dumps its last two boundaries."""
    cfg = write_preempt_job(tmp_path, "term", STEPS, "kill_wait_s: 2")
    log = tmp_path / "term.h5"
    code, out = run_and_signal([str(cfg), "--log", str(log)], signal.SIGTERM, 3)
    assert code == PREEMPTED, out[-3000:]
    dumps = sorted((tmp_path / "term.h5.ckpt").glob("dump-*/rank-*.npz"))
    assert [p.name for p in dumps] == ["rank-0.npz", "rank-1.npz", "rank-2.npz"], dumps
    steps, events = log_steps_and_events(log)
    assert events[-1][0] == "preempted" and events[-1][1]["abandoned"], events
    assert events[-1][1]["signal"] == "SIGALRM"  # nereus run turned SIGTERM into SIGALRM
    code, out = run_and_signal([str(cfg), "--log", str(log), "--resume"], None, 0)
    assert code == 0, out[-3000:]
    steps2, events = log_steps_and_events(log)
    assert steps2 == list(range(STEPS)), steps2
    restart = events[-1]
    assert restart[0] == "restart" and "dump-" in restart[1]["from_checkpoint"]
    assert restart[1]["step"] in (len(steps), len(steps) - 1)  # one of the two kept boundaries
    bit_exact(reference, np.load(tmp_path / "term.npz"))
