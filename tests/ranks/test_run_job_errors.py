"""``nereus run`` with a bad config or an infeasible job: one stderr line and exit 2 (3 when
infeasible), no log, before mpiexec is looked for or any rank starts (the CLI as a child
process; the runs themselves: mpi/test_run_job.py).
"""

from __future__ import annotations

import time
from pathlib import Path

from support.run_jobs import SMALL, nereus, write_job


def test_bad_config_is_one_line_exit_2(tmp_path: Path) -> None:
    cfg = write_job(tmp_path, "bad.yaml", "{steps: 0}")
    t0 = time.monotonic()
    res = nereus("run", str(cfg), "--log", str(tmp_path / "x.h5"), timeout_s=120)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "runtime.steps" in lines[0], res.stderr
    assert not (tmp_path / "x.h5").exists()
    assert time.monotonic() - t0 < 60


def test_unknown_runtime_key_and_bad_event(tmp_path: Path) -> None:
    for runtime, field in (("{stepz: 3}", "runtime"),
                           ("{events: [{at_step: 1, remove_node: 9}]}", "remove_node")):
        res = nereus("run", str(write_job(tmp_path, "b.yaml", runtime)), timeout_s=120)
        assert res.returncode == 2, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and field in res.stderr


def test_infeasible_plan_is_one_line_exit_3(tmp_path: Path) -> None:
    cfg = tmp_path / "tiny-mem.yaml"
    cfg.write_text(SMALL.replace("memory_per_gpu_gb: 0.5", "memory_per_gpu_gb: 0.001"))
    res = nereus("run", str(cfg), timeout_s=120)
    assert res.returncode == 3, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nereus: infeasible:"), res.stderr
