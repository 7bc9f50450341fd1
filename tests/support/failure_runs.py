"""What the rank-death tests (mpi/test_failures.py, slurm/test_failures_random.py, the Slurm
node-down test) share: the job they run, and how a run's summary, its rank-failure events and its
final state are read and compared (same seed -> the same training under any plan)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ADAM_LR = 1e-3  # runtime.lr default
# PPO with the task reward (no reward model): its plans fit on as few as 2 ranks.
JOB = """
job: {algorithm: ppo, mode: sync, global_batch: 12, minibatches: 2, prompt_len: 8, gen_len: 16,
      reward_model: false}
models: {actor: tiny-gpt, critic: tiny-gpt, reference: tiny-gpt}
"""


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
