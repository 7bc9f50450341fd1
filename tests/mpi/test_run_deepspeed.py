"""``nereus run`` with ``runtime.train_engine: deepspeed``: the trainers as DeepSpeed ZeRO units on
4 MPI ranks (2 nodes x 2), tiny-gpt PPO, 3 steps (mpi marker; ~40 s a run on 2 shared cores).

- The DeepSpeed engine trains to the Megatron engine's parameters within the tolerance of
  tests/mpi/test_run_job.py (reduction order: the Megatron engine's planner puts the trainers at
  tp 2, the DeepSpeed engine at dp 2 — a different GEMM/all-reduce summation order; relative
  difference of the whole state ≤ 1e-4, per element ≤ 3·lr). Same losses to 1e-4 relative.
- A forced DP change of both trainers (dp 2 → 1 after step 0, 1 → 2 after step 1, every other
  model-stage pinned to its layout and DP, so nothing else moves) runs the live ZeRO
  re-partition (the log's transitions say ``zero-repartition``, per trainer and direction, with
  the minimum bytes) for ZeRO stages 1 and 2, and the run ends where the run without it does,
  within the same reduction-order tolerance. Not bit-exact: the step at dp 1 ends 1 ulp away
  from the dp-2 step on some elements (1.2e-7 at most; the same micro-batches, so it is
  DeepSpeed's dp-2 gradient reduction against the dp-1 accumulation — not pinned down further).
  The re-partition itself is bit-exact against DeepSpeed's own state at the target DP
  (tests/ranks/test_deepspeed_zero.py).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.run_jobs import SMALL, nereus

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("mpiexec") is None,
                                 reason="needs mpiexec (the mpi extra)"),
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                 reason="the deepspeed package is not installed (extra "
                                        "'deepspeed', installed by dev/setup.sh)")]
ADAM_LR = 1e-3  # runtime.lr default
JOB = (SMALL.replace("cluster: {nodes: 4, gpus_per_node: 1", "cluster: {nodes: 2, gpus_per_node: 2")
       .replace("minibatches: 2", "minibatches: 4"))
# every model-stage but the trainers at the initial plan's layout and DP (so nothing else moves)
KEEP = "actor-gen: [1, 1, 4], ref-inf: [1, 2, 1], reward-inf: [1, 1, 1], critic-inf: [1, 1, 1]"
FORCED = ("force_transitions: [{at_step: 0, layouts: {KEEP, actor-train: [1, 1, 1], "
          "critic-train: [1, 1, 1]}}, {at_step: 1, layouts: {KEEP, actor-train: [1, 1, 2], "
          "critic-train: [1, 1, 2]}}]").replace("KEEP", KEEP)
RUNS = {
    "megatron": "train_engine: megatron",
    "zero1": "train_engine: deepspeed, deepspeed: {stage: 1}",
    "zero1-forced": "train_engine: deepspeed, deepspeed: {stage: 1}, " + FORCED,
    "zero2": "train_engine: deepspeed, deepspeed: {stage: 2}",
    "zero2-forced": "train_engine: deepspeed, deepspeed: {stage: 2}, " + FORCED,
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Each run once per module, on demand: (summary, final parameters, log path)."""
    tmp = tmp_path_factory.mktemp("dsrun")
    done: dict[str, Any] = {}

    def run(name: str) -> tuple[dict[str, Any], dict[str, np.ndarray], Path]:
        if name not in done:
            cfg = tmp / f"{name}.yaml"
            npz = tmp / f"{name}.npz"
            cfg.write_text(f"{JOB}runtime: {{steps: 3, adapt: false, save_state: {npz}, "
                           f"{RUNS[name]}}}\n")
            log = tmp / f"{name}.h5"
            res = nereus("run", str(cfg), "--log", str(log), "--json")
            assert res.returncode == 0, res.stderr[-3000:]
            summary = json.loads(res.stdout.strip().splitlines()[-1])
            with np.load(npz) as z:
                done[name] = (summary, {k: z[k] for k in z.files}, log)
        return done[name]
    return run


def test_deepspeed_engine_trains_like_the_megatron_engine(runs: Any) -> None:
    meg, meg_state, _ = runs("megatron")
    ds, ds_state, _ = runs("zero1")
    # the DeepSpeed engine's trainers at tp = pp = 1 (the planner proposes nothing else)
    assert all(" aT2.1.1 " in f" {p} " and " cT2.1.1 " in f" {p} " for p in ds["plans"]), ds
    assert ds["rewards"] == meg["rewards"] and ds["lengths"] == meg["lengths"]
    _close(ds, ds_state, meg, meg_state)


@pytest.mark.parametrize("stage", [1, 2])
def test_forced_dp_change_repartitions_live(runs: Any, stage: int) -> None:
    from nereus.log.reader import read_run_log

    base, base_state, _ = runs(f"zero{stage}")
    forced, forced_state, log = runs(f"zero{stage}-forced")
    assert forced["transitions"] == 2 and base["transitions"] == 0
    table = read_run_log(log).tables["transitions"]
    assert [d["executor"] for d in table["dag"]] == ["zero-repartition"] * 2
    seen = sorted((p["model_stage"], tuple(p["dp"])) for prims in table["primitives"]
                  for p in prims)
    assert seen == sorted((n, dp) for n in ("actor-train", "critic-train")
                          for dp in ((2, 1), (1, 2)))
    for prims in table["primitives"]:
        for p in prims:
            assert p["kind"] == "zero-repartition" and p["bytes"] == p["bytes_min"] > 0
    # the same samples; the losses and the state up to the reduction order (see the docstring)
    assert forced["rewards"] == base["rewards"] and forced["lengths"] == base["lengths"]
    _close(forced, forced_state, base, base_state)


def _close(a: dict[str, Any], a_state: dict[str, np.ndarray], b: dict[str, Any],
           b_state: dict[str, np.ndarray]) -> None:
    """Losses within 1e-4 relative; the state within 1e-4 relative as a whole and 3·lr per
    element (tests/mpi/test_run_job.py: Adam's normalized step of an element whose gradient is
    near ε can move by up to lr per step under another reduction order)."""
    for x, y in zip(a["losses"], b["losses"], strict=True):
        for k in ("actor-train", "critic-train"):
            assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-7)
    assert set(a_state) == set(b_state)
    num = sum(float(np.sum((a_state[k] - b_state[k]) ** 2)) for k in a_state)
    den = sum(float(np.sum(b_state[k] ** 2)) for k in a_state)
    assert np.sqrt(num / den) <= 1e-4
    assert max(float(np.max(np.abs(a_state[k] - b_state[k]))) for k in a_state) <= 3 * ADAM_LR
