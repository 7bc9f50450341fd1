"""Every rank of one node killed at random moments inside a Slurm allocation never loses state,
never hangs (ULFM).

One ``sbatch`` job on the local 3-node Slurm (two ranks per node, tiny PPO, 2 steps, a
checkpoint before the first step and after every step) runs ``nereus run`` with srun once per
moment, one after the other in the same allocation: a random node's ranks all die (SIGKILL,
``runtime.failures.kill``) a random time into step 0 or 1, or into the boundary after step 0.
Each run must end (exit 0, within 180 s of the death) with the rewards, lengths, losses and
parameters of the reference: the same job run without failures (the initial plan kept) on a
local mpiexec, once per session and shared with tests/mpi/test_frames_kill.py
(``support.failure_runs.six_rank_reference``; same seed, the same training under any launcher
and plan, as with the Slurm preemption tests' local reference). The state must come from the
surviving replicas exactly when one of every model-stage survived (else from the checkpoint).
``NEREUS_FAILURE_MOMENTS`` sets the number of moments (default 3; 20 for the longer draw); the
draws are seeded (``NEREUS_FAILURE_SEED``, default 7). The first three moments are drawn stratified: every node once, and each of step 0,
step 1 and the boundary after step 0 once (which node dies where, and how long into it, drawn
at random), so the default run covers every node, both steps and the boundary (as the former
default of 8 uniform draws did, in 3 runs instead of 8); moments beyond the third are uniform
draws. Runtime: about 40-60 s per moment on 2 cores (6 ranks starting up dominate). With seed
7 and 20 uniform draws (the former scheme) 18 deaths were survived from replicas and 2 came
after the run ended; deaths of the last copy (resume from the checkpoint) are covered by
tests/mpi/test_failures.py.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.failure_runs import failure_events, same_training, summary, two_step_job
from support.slurm_cluster import LocalSlurm, job_info, wait_for, wait_job

from nereus.spec.workflow import build_workflow

pytestmark = pytest.mark.slow
NODES, GPN = 3, 2  # the local Slurm cluster's nodes; ranks per node (so replicas can survive)
MOMENTS = int(os.environ.get("NEREUS_FAILURE_MOMENTS", "3"))
SEED = int(os.environ.get("NEREUS_FAILURE_SEED", "7"))  # repeated runs draw other moments
# the strata of the first moments: (step, phase) — both steps, and the boundary after step 0
CELLS = ((0, "step"), (1, "step"), (0, "transition"))


def _moments(n: int) -> list[tuple[int, int, str, float]]:
    """(node, step, phase, seconds into it) of ``n`` deaths: the first max(NODES, len(CELLS))
    stratified (every node once, every cell once, paired at random), the rest uniform."""
    rng = random.Random(SEED)
    nodes, cells = rng.sample(range(NODES), NODES), rng.sample(CELLS, len(CELLS))
    out = []
    for i in range(n):
        if i < max(NODES, len(CELLS)):
            node, (step, phase) = nodes[i % NODES], cells[i % len(CELLS)]
        else:
            node, step = rng.randrange(NODES), rng.randrange(2)
            phase = rng.choice(("step", "step", "transition"))
        out.append((node, step, phase, round(rng.uniform(0.0, 1.5), 2)))
    return out


def _batch_script(tmp: Path, runs: dict[str, str]) -> Path:
    """One job step per run, in order, in one allocation: ``nereus run`` under srun as
    slurm/cpu.sbatch starts it; each run's exit status, output and end time kept."""
    lines = ["#!/bin/bash", "set -u", "export OMP_NUM_THREADS=1 SLURM_NO_KILL=set",
             f"trap 'date +%s > {tmp / 'job.done'}' EXIT"]
    for name, runtime in runs.items():
        cfg = two_step_job(tmp, name, runtime)
        lines.append(f"srun --mpi=pmi2 --cpu-bind=none --kill-on-bad-exit=0 --no-kill "
                     f"{sys.executable} -m nereus run {cfg} --log {tmp / f'{name}.h5'} --json "
                     f"--timeout-s 300 > {tmp / f'{name}.out'} 2> {tmp / f'{name}.err'}; "
                     f"echo $? > {tmp / f'{name}.rc'}; date +%s.%N > {tmp / f'{name}.end'}")
    script = tmp / "moments.sbatch"
    script.write_text("\n".join(lines) + "\n")
    return script


def _result(tmp: Path, name: str) -> subprocess.CompletedProcess[str]:
    rc = tmp / f"{name}.rc"
    return subprocess.CompletedProcess(
        [name], int(rc.read_text()) if rc.exists() else -1,
        (tmp / f"{name}.out").read_text() if (tmp / f"{name}.out").exists() else "",
        (tmp / f"{name}.err").read_text() if (tmp / f"{name}.err").exists() else "")


def _replica_survives(plan: dict[str, Any], dead: set[int]) -> bool:
    """Every model-stage keeps a replica, or (a frozen copy) its trained source does: the
    recovery's rule (Workflow.lost_stages; the job is synchronous PPO)."""
    alive = {sp["name"]: any(not dead & set(r) for r in sp["replicas"]) for sp in plan["stages"]}
    return not build_workflow("ppo").lost_stages(alive)


@pytest.mark.timeout(2400)  # MOMENTS runs of 6 ranks (+ the reference): ~3 min for 3 on 2 cores
def test_random_node_deaths_inside_a_slurm_allocation(
        slurm_cluster: LocalSlurm, tmp_path: Path,
        six_rank_reference: tuple[dict[str, Any], Any, dict[str, Any]]) -> None:
    moments = _moments(MOMENTS)
    runs: dict[str, str] = {}
    for i, (node, step, phase, after_s) in enumerate(moments):
        runs[f"m{i}"] = (f"failures: {{checkpoint_every: 1, kill: [{{node: {node}, at_step: "
                         f"{step}, phase: {phase}, after_s: {after_s}}}]}}")
    script = _batch_script(tmp_path, runs)
    res = slurm_cluster.run("sbatch", "--parsable", f"--output={tmp_path}/job.txt",
                            "--time=00:40:00", f"--nodes={NODES}", f"--ntasks-per-node={GPN}",
                            str(script))
    job_id = res.stdout.strip().split(";")[0]
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
    try:
        # The batch script marks its end in a file, so the minutes pass without asking the
        # busy slurmctld; its state is asked only every 30 s (in case Slurm ended the job).
        last_ask = [time.monotonic()]

        def script_ended() -> bool:
            if (tmp_path / "job.done").exists():
                return True
            if time.monotonic() - last_ask[0] < 30:
                return False
            last_ask[0] = time.monotonic()
            with contextlib.suppress(subprocess.TimeoutExpired, subprocess.CalledProcessError):
                return job_info(slurm_cluster, job_id).state in ended
            return False

        wait_for("the batch script's end", script_ended, timeout_s=2300)
        info = wait_job(slurm_cluster, job_id, ended, timeout_s=120)
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
    assert info.state == "COMPLETED", (tmp_path / "job.txt").read_text()[-3000:]
    ref, xref, plan = six_rank_reference
    for i, (node, step, phase, after_s) in enumerate(moments):
        name = f"m{i}"
        res = _result(tmp_path, name)
        ended_at = float((tmp_path / f"{name}.end").read_text())
        where = (name, node, step, phase, after_s, res.stderr[-2000:])
        out = summary(res)
        assert out["relaunches"] == 0, where  # ULFM survives a node's ranks: no relaunch
        same_training(ref, out, xref, np.load(tmp_path / f"{name}.npz"))
        events = failure_events(tmp_path / f"{name}.h5")
        if not (tmp_path / f"{name}.h5.kills").exists():
            assert not events, where  # the run ended before the moment came
            continue
        if node == 0:  # the controller died: the rest of the run is in the successor's log
            events = [e for p in sorted(tmp_path.glob(f"{name}.after-failure-*.h5"))
                      for e in failure_events(p)]
        dead = set(range(node * GPN, (node + 1) * GPN))
        assert len(events) == 1 and set(events[0]["lost_ranks"]) == dead, where
        killed_at = float((tmp_path / f"{name}.h5.kills").read_text().split()[1])
        assert ended_at - killed_at < 180, where  # no hang after the death
        survived = _replica_survives(plan, dead)
        assert (events[0]["restored_from"] == "replicas") == survived, where
