"""What the rank-death tests (mpi/test_failures.py, slurm/test_failures_random.py, the Slurm
node-down test) share: the job they run, and how a run's summary, its rank-failure events and its
final state are read and compared (same seed -> the same training under any plan)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.paths import REPO

ADAM_LR = 1e-3  # runtime.lr default
# PPO with the task reward (no reward model): its plans fit on as few as 2 ranks.
JOB = """
job: {algorithm: ppo, mode: sync, global_batch: 12, minibatches: 2, prompt_len: 8, gen_len: 16,
      reward_model: false}
models: {actor: tiny-gpt, critic: tiny-gpt, reference: tiny-gpt}
"""

# 3 nodes x 2 ranks: a replica of every model-stage survives the loss of any one node
SIX_RANKS = "cluster: {nodes: 3, gpus_per_node: 2, gpu: cpu, memory_per_gpu_gb: 0.5}\n"


def two_step_job(tmp: Path, name: str, runtime: str) -> Path:
    """JOB on SIX_RANKS for 2 steps, its final parameters saved to ``tmp/name.npz``; ``runtime``
    the rest of the runtime section."""
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(JOB + SIX_RANKS + f"runtime: {{steps: 2, timeout_s: 30, "
                   f"save_state: {tmp / f'{name}.npz'}, {runtime}}}\n")
    return cfg


@pytest.fixture(scope="session")
def six_rank_reference(tmp_path_factory: pytest.TempPathFactory
                       ) -> tuple[dict[str, Any], Any, dict[str, Any]]:
    """The uninterrupted run of :func:`two_step_job` (the initial plan kept) on a local mpiexec,
    once per session: the reference of the frame kills (mpi/test_frames_kill.py) and of the
    node deaths inside a Slurm allocation (slurm/test_failures_random.py), the same job.
    (summary, final parameters, initial plan)."""
    from nereus.log.reader import read_run_log
    from nereus.runtime.mpi.frames import KILL_ENV

    tmp = tmp_path_factory.mktemp("six-rank-reference")
    cfg = two_step_job(tmp, "ref", "adapt: false")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != KILL_ENV}
    res = subprocess.run([sys.executable, "-m", "nereus", "run", str(cfg), "--log",
                          str(tmp / "ref.h5"), "--json", "--timeout-s", "400"],
                         capture_output=True, text=True, timeout=460, cwd=REPO, env=env)
    return summary(res), np.load(tmp / "ref.npz"), read_run_log(tmp / "ref.h5").initial_plan


def summary(res: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert res.returncode == 0, res.stderr[-4000:]
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def failure_events(log: Path) -> list[dict[str, Any]]:
    from nereus.log.reader import read_run_log

    ev = read_run_log(log).events
    return [dict(d) for k, d in zip(ev["kind"], ev["detail"], strict=True) if k == "rank-failure"]


def same_training(base: dict[str, Any], other: dict[str, Any], xb: Any, xo: Any) -> None:
    assert base["rewards"] == other["rewards"] and base["lengths"] == other["lengths"]
    for lb, lo in zip(base["losses"], other["losses"], strict=True):
        for k in lb:
            assert lo[k] == pytest.approx(lb[k], rel=1e-4, abs=1e-7), k
    assert set(xb.files) == set(xo.files)
    diff2 = ref2 = 0.0
    for k in xb.files:
        d = xo[k].astype(np.float64) - xb[k]
        assert np.abs(d).max() <= 3 * ADAM_LR, k
        diff2 += float((d * d).sum())
        ref2 += float((xb[k].astype(np.float64) ** 2).sum())
    assert diff2 ** 0.5 <= 1e-4 * ref2 ** 0.5
