"""Real rank deaths under ``nereus run`` (ULFM): every rank of a virtual node is SIGKILLed.

The dying ranks kill themselves at a chosen moment (``runtime.failures.kill``: into a step, or
into a plan change); the survivors shrink the MPI communicator, rebuild the data plane, take the
controller over when rank 0 died, and finish. Same seed → same samples under any plan, so the
run with deaths must end where the run without them ends (tolerances of test_run_job.py: a
different plan reduces in another order). Runtime on 2 shared cores: about 3 minutes (four
runs of 3–6 ranks; start-up dominates).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.failure_runs import JOB, failure_events, same_training, summary

pytestmark = pytest.mark.skipif(shutil.which("mpiexec") is None,
                                reason="needs mpiexec (the mpi extra)")
ROOT = Path(__file__).resolve().parents[2]
SIX = "cluster: {nodes: 3, gpus_per_node: 2, gpu: cpu, memory_per_gpu_gb: 0.5}\n"
THREE = "cluster: {nodes: 3, gpus_per_node: 1, gpu: cpu, memory_per_gpu_gb: 0.5}\n"
STEPS = 4


def run(tmp: Path, name: str, cluster: str, runtime: str, timeout_s: float = 900.0,
        steps: int = STEPS) -> tuple[subprocess.CompletedProcess[str], float]:
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(JOB + cluster + f"runtime: {{steps: {steps}, timeout_s: 30, "
                   f"save_state: {tmp / f'{name}.npz'}, {runtime}}}\n")
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "nereus", "run", str(cfg), "--log",
                          str(tmp / f"{name}.h5"), "--json", "--timeout-s", str(timeout_s)],
                         capture_output=True, text=True, timeout=timeout_s + 60, cwd=ROOT)
    return res, time.monotonic() - t0


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any]:
    tmp = tmp_path_factory.mktemp("reference")
    res, _ = run(tmp, "base", SIX, "adapt: false")
    return summary(res), np.load(tmp / "base.npz")


def test_node_deaths_mid_step_and_mid_transition_keep_the_state(
        tmp_path: Path, reference: tuple[dict[str, Any], Any]) -> None:
    """3 nodes x 2 ranks. Node 2 dies 0.3 s into step 1 (replicas of every model-stage survive
    on nodes 0-1); a forced TP change after step 2 starts and node 0 — with rank 0, the
    controller — dies 0.2 s into it; node 1's ranks finish the job alone."""
    res, _ = run(tmp_path, "kill", SIX,
                      "force_transitions: [{at_step: 2, layouts: {actor-gen: [2, 1]}}], "
                      "failures: {checkpoint_every: 1, kill: ["
                      "{node: 2, at_step: 1, after_s: 0.3}, "
                      "{node: 0, at_step: 2, phase: transition, after_s: 0.2}]}")
    out = summary(res)
    same_training(reference[0], out, reference[1], np.load(tmp_path / "kill.npz"))
    first = failure_events(tmp_path / "kill.h5")
    assert len(first) == 1 and first[0]["lost_ranks"] == [4, 5], first
    assert first[0]["restored_from"] == "replicas" and first[0]["steps_lost"] == 0
    assert first[0]["resume_step"] == 1  # step 1 runs again from the state before it
    # Rank 0 died second: the lowest survivor took the controller over and a second log.
    after = sorted(tmp_path.glob("kill.after-failure-*.h5"))
    assert after, list(tmp_path.iterdir())
    second = failure_events(after[-1])
    assert second[-1]["lost_ranks"] == [0, 1] and second[-1]["survivors"] == [2, 3]


def test_last_copy_lost_resumes_from_the_checkpoint(
        tmp_path: Path, reference: tuple[dict[str, Any], Any]) -> None:
    """3 nodes x 1 rank: the only critic replicas sit on rank 2; node 2 dies in step 2. The
    survivors resume from the checkpoint before step 2 and still end on the reference."""
    res, _ = run(tmp_path, "ckpt", THREE,
                 "failures: {checkpoint_every: 1, kill: [{node: 2, at_step: 2, after_s: 0.3}]}")
    out = summary(res)
    same_training(reference[0], out, reference[1], np.load(tmp_path / "ckpt.npz"))
    ev = failure_events(tmp_path / "ckpt.h5")
    assert len(ev) == 1 and ev[0]["restored_from"].endswith("step-00000002.npz"), ev
    from nereus.log.reader import read_run_log

    kinds = list(read_run_log(tmp_path / "ckpt.h5").events["kind"])
    assert "restart" in kinds and "checkpoint" in kinds


def test_last_copy_lost_without_checkpoint_is_one_error(tmp_path: Path) -> None:
    res, _ = run(tmp_path, "lost", THREE, "failures: {kill: [{node: 2, at_step: 0, after_s: 0.3}]}")
    ended_at = time.time()
    assert res.returncode != 0
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("nereus: ")]
    assert len(errors) == 1, res.stderr[-3000:]
    assert "died with every replica of" in errors[0] and "checkpoint" in errors[0]
    killed_at = float((tmp_path / "lost.h5.kills").read_text().split()[1])
    assert ended_at - killed_at < 120  # no hang: the survivors end soon after the death


def test_mpi_runtime_death_relaunches_on_the_survivors_from_the_checkpoint(
        tmp_path: Path, reference: tuple[dict[str, Any], Any]) -> None:
    """3 nodes x 1 rank; 0.3 s into step 2 node 2's rank dies and takes the MPI runtime with it
    (as Open MPI ends the job when it loses a node's daemon): every rank is gone, so ULFM has
    nobody to recover with. The launcher relaunches on nodes 0-1 from the newest checkpoint
    (before step 2), in a second log segment, and the run still ends on the reference."""
    res, _ = run(tmp_path, "rl", THREE, "failures: {checkpoint_every: 1, kill: "
                 "[{node: 2, at_step: 2, after_s: 0.3, runtime: true}]}")
    out = summary(res)
    assert out["relaunches"] == 1, res.stderr[-3000:]
    assert out["log_segments"] == [str(tmp_path / "rl.h5"), str(tmp_path / "rl.relaunch-1.h5")]
    # the summary covers the whole run: steps 0-1 from the checkpoint's record, 2-3 redone
    same_training(reference[0], out, reference[1], np.load(tmp_path / "rl.npz"))
    assert out["steps"] == STEPS
    told = [ln for ln in res.stderr.splitlines() if "relaunch 1/1" in ln]
    assert len(told) == 1 and "nodes lost: node2" in told[0] and "step 2" in told[0], told
    from nereus.log.reader import read_run_log

    first, second = read_run_log(tmp_path / "rl.h5"), read_run_log(tmp_path / "rl.relaunch-1.h5")
    assert list(first.steps["step"]) == [0, 1]  # step 2 died with the runtime
    assert [float(r) for r in first.steps["reward"]] == reference[0]["rewards"][:2]
    assert list(second.steps["step"]) == [2, 3]  # redone from the checkpoint before step 2
    assert max(g for sp in second.initial_plan["stages"] for r in sp["replicas"] for g in r) <= 1


def test_mpi_runtime_death_without_checkpoint_is_one_error(tmp_path: Path) -> None:
    res, _ = run(tmp_path, "nock", THREE,
                 "failures: {kill: [{node: 2, at_step: 0, after_s: 0.3, runtime: true}]}")
    assert res.returncode != 0
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("nereus: ")]
    assert len(errors) == 1, res.stderr[-3000:]
    assert "mpiexec exited with status" in errors[0]
