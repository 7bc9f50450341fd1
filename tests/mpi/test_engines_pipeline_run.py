"""Pipeline stages in ``nereus run``: a run on 2 MPI ranks moves actor-gen to two pipeline stages
mid-run and is compared with the same run without the move (the stages themselves, over gloo:
ranks/test_engines_pipeline.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.run_jobs import GRPO_2_RANKS

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


# ---- `nereus run`: actor-gen moved to pp=2 mid-run keeps the training semantics ----

ADAM_LR = 1e-3  # runtime.lr default


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs mpiexec (the mpi extra)")
def test_run_with_generation_moved_to_two_pipeline_stages(
        tmp_path: Path, grpo_two_rank_base: tuple[dict[str, Any], Path]) -> None:
    """GRPO on 2 ranks; the planner trains actor-train at pp=2 from the start. Forced: actor-gen
    goes from two 1×1 replicas to one 1×2 unit after step 0 (KV-cache decode through the
    pipeline, weight sync from the 1×2 trainer). Same seed → the same sampled tokens, rewards
    and lengths; the rollout log-probs come from a different generation batch split (dp 2 → 1),
    whose fp32 GEMMs may round differently (~1e-7 relative), hence the tolerances of
    tests/mpi/test_run_job.py on losses and parameters. The base run (the same job, the plan
    kept) is the session's (support.run_jobs.grpo_two_rank_base, shared with test_run_job.py)."""
    b, base_npz = grpo_two_rank_base
    cfg = tmp_path / "forced.yaml"
    runtime = ("{steps: 2, adapt: false, reward: model, save_state: %s, "
               "force_transitions: [{at_step: 0, layouts: {actor-gen: [1, 2]}}]}")
    cfg.write_text(GRPO_2_RANKS + "runtime: " + runtime % (tmp_path / "forced.npz") + "\n")
    res = subprocess.run([sys.executable, "-m", "nereus", "run", str(cfg), "--log",
                          str(tmp_path / "forced.h5"), "--json"], capture_output=True,
                         text=True, timeout=400, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    m: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    assert all(p.split()[-1].endswith(".1.2") for p in b["plans"]), b["plans"]  # aT at pp=2
    assert m["transitions"] == 1 and m["plans"][1].split()[0] == "gen1.1.2", m["plans"]
    assert b["lengths"] == m["lengths"] and b["rewards"] == m["rewards"]
    for lb, lm in zip(b["losses"], m["losses"], strict=True):
        assert lb["actor-train"] != 0.0
        assert lm["actor-train"] == pytest.approx(lb["actor-train"], rel=1e-4, abs=1e-7)
    xb, xm = np.load(base_npz), np.load(tmp_path / "forced.npz")
    assert set(xb.files) == set(xm.files)
    diff2 = ref2 = 0.0
    for k in xb.files:
        d = xm[k].astype(np.float64) - xb[k]
        assert np.abs(d).max() <= 3 * ADAM_LR, k
        diff2 += float((d * d).sum())
        ref2 += float((xb[k].astype(np.float64) ** 2).sum())
    assert diff2 ** 0.5 <= 1e-4 * ref2 ** 0.5
