"""A requeued Slurm job whose newest checkpoint file is torn resumes from the previous good one.

``slurm/cpu.sbatch`` (srun → ``nereus run`` → mpiexec → 2 ranks, ``checkpoint_every: 1``) is
preempted with Slurm's warning (``scancel --signal=USR1 --batch``): the ranks checkpoint at the
next step boundary, exit 75, and the batch shell requeues the job. While the requeued job waits
(held, so the test does not race it), its newest checkpoint is torn — cut in half, as a node lost
while the file system wrote it leaves it. Released, the job (``SLURM_RESTART_COUNT`` 1) warns
about the torn file by name, resumes from the checkpoint before it, redoes that step and ends
with the parameters of an uninterrupted run, bit for bit; every step is in the log once.

Slow (a few minutes on 2 shared cores).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.failure_runs import JOB
from support.preempt_runs import log_steps_and_events, run_and_signal
from support.slurm_cluster import LocalSlurm, job_info, wait_for, wait_job

REPO = Path(__file__).resolve().parents[2]
STEPS = 8


def write_job(tmp: Path, name: str) -> Path:
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(JOB + "cluster: {nodes: 1, gpus_per_node: 2, gpu: cpu, memory_per_gpu_gb: "
                   f"0.5}}\nruntime: {{steps: {STEPS}, timeout_s: 30, adapt: false, save_state: "
                   f"{tmp / f'{name}.npz'}, failures: {{checkpoint_every: 1, kill_wait_s: 2}}}}\n")
    return cfg


def printed_steps(path: Path) -> int:
    text = path.read_text(errors="replace") if path.exists() else ""
    return sum(1 for ln in text.splitlines() if ln.startswith("step ") and f"/{STEPS}" in ln)


def newest_checkpoint(folder: Path) -> Path:
    return sorted(folder.glob("step-*.npz"))[-1]


@pytest.mark.timeout(900)
def test_a_requeued_job_whose_newest_checkpoint_is_torn_resumes_from_the_one_before(
        slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    ref_cfg = write_job(tmp_path, "ref")
    code, text = run_and_signal([str(ref_cfg), "--log", str(tmp_path / "ref.h5")], None, 0)
    assert code == 0, text[-3000:]
    ref: Any = np.load(tmp_path / "ref.npz")

    cfg = write_job(tmp_path, "run")
    log, out = tmp_path / "run.h5", tmp_path / "out.txt"
    res = slurm_cluster.run(
        "sbatch", "--parsable", f"--output={out}", "--time=00:15:00", "-N", "1",
        str(REPO / "slurm" / "cpu.sbatch"), str(cfg), "--log", str(log))
    job_id = res.stdout.strip().split(";")[0]
    wait_for("step 3", lambda: printed_steps(out) >= 3, timeout_s=300)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job_id)  # Slurm's warning
    wait_for("the requeue", lambda: job_info(slurm_cluster, job_id).restarts == 1, 120)
    # A requeued job waits cred_expire + 1 s (11 s here) before it may start again: hold it
    # meanwhile, so that the checkpoint is torn before the job can read it.
    slurm_cluster.run("scontrol", "hold", job_id)
    # The requeue can be counted while the first instance's processes still end (COMPLETING,
    # already held): only once they have may the checkpoint be torn, and the job must not run.
    wait_for("the first instance to end",
             lambda: job_info(slurm_cluster, job_id).state != "COMPLETING", 120)
    held = job_info(slurm_cluster, job_id)
    assert held.state == "PENDING", f"the requeued job started before it was held: {held}"
    folder = Path(f"{log}.ckpt")
    torn = newest_checkpoint(folder)
    previous = sorted(folder.glob("step-*.npz"))[-2]
    data = torn.read_bytes()
    torn.write_bytes(data[: len(data) // 2])
    torn_step = int(torn.name[5:13])
    previous_hash = hashlib.sha256(previous.read_bytes()).hexdigest()
    slurm_cluster.run("scontrol", "release", job_id)

    info = wait_job(slurm_cluster, job_id, ("COMPLETED", "FAILED", "CANCELLED"), timeout_s=600)
    text = out.read_text(errors="replace")
    assert info.state == "COMPLETED", text[-4000:]
    assert f"nereus: warning: skipped {torn}: it is not a complete .npz archive" in text, \
        text[-4000:]
    assert f"Slurm restart 1: resuming from {folder} (step {torn_step - 1})" in text, text[-4000:]
    assert hashlib.sha256(previous.read_bytes()).hexdigest() == previous_hash  # read, not changed
    steps, events = log_steps_and_events(log)
    assert steps == list(range(STEPS)), steps  # every step once (the redone one: its later row)
    restarts = [d for k, d in events if k == "restart"]
    assert len(restarts) == 1 and restarts[0]["from_checkpoint"] == str(previous), events
    assert restarts[0]["redone_steps"] == [torn_step - 1], restarts
    got = np.load(tmp_path / "run.npz")
    assert set(got.files) == set(ref.files) and ref.files
    for k in ref.files:
        assert np.array_equal(ref[k], got[k]), k
