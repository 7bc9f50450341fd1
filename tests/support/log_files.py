"""Run logs written in-process for the log tests (pure/test_log.py, ranks/test_log_writer_procs.py):
one of every record type, each column checkable."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from nereus.log.writer import RunLogWriter
from nereus.spec.plan import ExecutionPlan, StagePlan

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def plan_of(tp: int, dp: int) -> ExecutionPlan:
    reps = tuple(tuple(r * tp + t for t in range(tp)) for r in range(dp))
    return ExecutionPlan((StagePlan("actor-gen", tp, 1, dp, 2, 1, False, reps),))


def write_full_log(path: Path, steps: int = 6, gpus: int = 3) -> None:
    """One of every record type; values chosen so that each column is checkable."""
    with RunLogWriter(
        path, {"job": "rt", "n": 1}, {"model": "tiny-gpt", "lr": 1e-5}, initial_plan=plan_of(2, 1)
    ) as w:
        for s in range(steps):
            w.log_calibration_sample(s, "h200", "gemm", 0.5 * s, 0.7 * s)
            w.log_efficiency(s, "h200", "attention", 0.25 + 0.01 * s)
            w.log_step(
                s,
                step_s=2.0 + s,
                gen_len_mean=10.0 * s,
                gen_len_p95=np.float64(20.0 * s),
                pool_gpus=gpus,
                stage_s={"actor-gen": 1.0 + s},
                reward=math.nan,
                peak_memory_bytes=[10 * s + g for g in range(gpus)],
                tokens=np.int64(7 * s),
            )
            if s == 2:
                w.log_replan(s, "gpu-pool-change", [plan_of(1, 2)], {"0": 1.5}, {"0": 3e9})
                w.log_admission(s, True, "urgent", {"why": "lost GPU", "gpu": 3}, 0.5, 0.2, 1.0)
                w.log_admission(s, False, "opportunistic", "ratio 0.7 > 0.5", 0.1, 0.3, 2.0)
                w.log_transition(
                    s,
                    {"nodes": [1, 2], "edges": [[1, 2]]},
                    ["split", "merge"],
                    123_456_789,
                    0.25,
                    0.5,
                    plan_of(1, 2),
                )
                w.log_event(s, "node-failure", {"node": "n3"}, time_s=1234.5)


def valid_log(tmp_path: Path) -> Path:
    path = tmp_path / "valid.h5"
    write_full_log(path)
    return path
