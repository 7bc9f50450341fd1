"""Preemption of a real ``nereus run`` on the local 3-node Slurm, twice, and through submitit.

1. ``slurm/cpu.sbatch`` (srun → ``nereus run`` → mpiexec → 4 ranks) is preempted twice: first
   Slurm's warning (``scancel --signal=USR1 --batch``, what ``--signal=B:USR1@120`` sends): the
   batch shell forwards it, the ranks checkpoint at the next step boundary and exit 75, the
   shell requeues the job; the requeued job (``SLURM_RESTART_COUNT`` 1) resumes by itself in the
   same log. Then ``scontrol requeue`` while it runs: Slurm's SIGTERM, ``KillWait`` (2 s here)
   and SIGKILL; the job resumes from what the ranks saved (their dumps, or the periodic
   checkpoint of ``checkpoint_every: 1``). The final parameters equal an uninterrupted run's, bit
   for bit; the log holds every step exactly once, and the two restarts.
2. submitit's preemption signal (USR2), twice → ``NereusEntry.checkpoint()`` → SIGUSR1 to
   ``nereus run`` → checkpoint → requeue → the next attempt runs ``nereus run --resume``; the
   same checks.

Slow (a few minutes each on 2 shared cores); run one at a time.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.failure_runs import JOB
from support.preempt_runs import log_steps_and_events, run_and_signal
from support.slurm_cluster import LocalSlurm, job_info, wait_for, wait_job

from launchers.submitit_entry import NereusEntry

REPO = Path(__file__).resolve().parents[2]
STEPS = 14


def write_job(tmp: Path, name: str, gpus_per_node: int, nodes: int) -> Path:
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(JOB + f"cluster: {{nodes: {nodes}, gpus_per_node: {gpus_per_node}, gpu: cpu, "
                   "memory_per_gpu_gb: 0.5}\n" + f"runtime: {{steps: {STEPS}, timeout_s: 30, "
                   f"adapt: false, save_state: {tmp / f'{name}.npz'}, "
                   "failures: {checkpoint_every: 1, kill_wait_s: 2}}\n")
    return cfg


def reference(tmp: Path, gpus_per_node: int, nodes: int) -> Any:
    """The uninterrupted run of the same job on as many ranks (a local mpiexec)."""
    cfg = write_job(tmp, "ref", gpus_per_node, nodes)
    code, out = run_and_signal([str(cfg), "--log", str(tmp / "ref.h5")], None, 0)
    assert code == 0, out[-3000:]
    return np.load(tmp / "ref.npz")


def printed_steps(path: Path) -> int:
    """How many step lines a job's output holds so far."""
    text = path.read_text(errors="replace") if path.exists() else ""
    return sum(1 for ln in text.splitlines() if ln.startswith("step ") and f"/{STEPS}" in ln)


def check_run(log: Path, ref: Any, got: Path, restarts: int) -> None:
    steps, events = log_steps_and_events(log)
    assert steps == list(range(STEPS)), steps  # every step exactly once
    assert [k for k, _ in events].count("restart") == restarts, events
    assert "preempted" in [k for k, _ in events], events
    other = np.load(got)
    assert set(other.files) == set(ref.files) and ref.files
    for k in ref.files:
        assert np.array_equal(ref[k], other[k]), k


@pytest.mark.timeout(900)
def test_cpu_template_preempted_twice_resumes_to_the_same_parameters(
        slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    ref = reference(tmp_path, 2, 2)
    cfg = write_job(tmp_path, "run", 2, 2)
    log, out = tmp_path / "run.h5", tmp_path / "out.txt"
    res = slurm_cluster.run(
        "sbatch", "--parsable", f"--output={out}", "--time=00:15:00", "-N", "2",
        str(REPO / "slurm" / "cpu.sbatch"), str(cfg), "--log", str(log))
    job_id = res.stdout.strip().split(";")[0]
    wait_for("step 2", lambda: printed_steps(out) >= 2, timeout_s=240)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job_id)  # Slurm's warning
    wait_for("the requeue", lambda: job_info(slurm_cluster, job_id).restarts == 1, 120)
    first = printed_steps(out)
    wait_for("the resumed run's steps", lambda: printed_steps(out) >= first + 2, timeout_s=240)
    slurm_cluster.run("scontrol", "requeue", job_id)  # SIGTERM, KillWait, SIGKILL, requeue
    wait_for("the second requeue", lambda: job_info(slurm_cluster, job_id).restarts == 2, 120)
    info = wait_job(slurm_cluster, job_id, ("COMPLETED", "FAILED", "CANCELLED"), timeout_s=400)
    text = out.read_text(errors="replace")
    assert info.state == "COMPLETED", text[-4000:]
    assert "requeueing job" in text and "Slurm restart 1: resuming" in text, text[-4000:]
    assert "Slurm restart 2: resuming" in text, text[-4000:]
    check_run(log, ref, tmp_path / "run.npz", 2)


@pytest.mark.timeout(900)
def test_submitit_preemption_resumes_nereus_run_to_the_same_parameters(
        slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    submitit = pytest.importorskip("submitit")
    ref = reference(tmp_path, 2, 1)
    cfg = write_job(tmp_path, "run", 2, 1)
    log = tmp_path / "run.h5"
    executor = submitit.AutoExecutor(folder=str(tmp_path / "%j"), cluster="slurm")
    executor.update_parameters(timeout_min=15, nodes=1, tasks_per_node=1, cpus_per_task=1)
    entry = NereusEntry.nereus_run(str(cfg), "--log", str(log), grace_s=60)
    assert entry.target[:4] == (sys.executable, "-m", "nereus", "run")
    job = executor.submit(entry)
    wait_for("step 2", lambda: Path(job.paths.stdout).exists()
             and printed_steps(Path(job.paths.stdout)) >= 2, timeout_s=240)
    time.sleep(0.5)
    slurm_cluster.run("scancel", f"--signal={int(signal.SIGUSR2)}", job.job_id)
    wait_for("the requeue", lambda: job_info(slurm_cluster, job.job_id).restarts == 1, 180)
    first = printed_steps(Path(job.paths.stdout))
    wait_for("the resumed attempt's steps",
             lambda: printed_steps(Path(job.paths.stdout)) >= first + 2, timeout_s=300)
    time.sleep(0.5)
    slurm_cluster.run("scancel", f"--signal={int(signal.SIGUSR2)}", job.job_id)  # again
    assert job.result() == 0
    assert job_info(slurm_cluster, job.job_id).restarts == 2
    assert "--resume" in job.stdout() or "--resume" in (job.stderr() or "")
    check_run(log, ref, tmp_path / "run.npz", 2)
