"""``nereus run`` with ``runtime.train_engine: deepspeed``: the trainers as DeepSpeed ZeRO units on
4 MPI ranks (2 nodes x 2), tiny-gpt PPO, 3 steps (mpi marker; ~40 s a run on 2 shared cores).

- The DeepSpeed engine trains to the Megatron engine's parameters within the tolerance of
  tests/mpi/test_run_job.py (reduction order: the Megatron engine's planner puts the trainers at
  tp 2, the DeepSpeed engine at dp 2 — a different GEMM/all-reduce summation order; relative
  difference of the whole state ≤ 1e-4, per element ≤ 3·lr). Same losses to 1e-4 relative.
- A forced DP change of both trainers (dp 2 → 1 after step 0, 1 → 2 after step 1, every other
  model-stage pinned to its layout) runs the live ZeRO re-partition (the log's transitions say
  ``zero-repartition``, the bytes moved are the minimum) and ends bit-exact against the run
  without it, for ZeRO stages 1 and 2. Bit-exact because each trainer replica holds one
  sequence of a minibatch at dp 2 (``minibatches: 4``): the two-rank gradient sum a + b equals
  the dp-1 accumulation a + b, the dp scaling of the losses is a power of two, and the
  re-partition itself is exact (tests/ranks/test_deepspeed_zero.py). Parameters equal to the bit
  after Adam steps taken on the re-partitioned moments say the moments and the step were equal.
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
    for a, b in zip(ds["losses"], meg["losses"], strict=True):
        for k in ("actor-train", "critic-train"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-7)
    assert set(ds_state) == set(meg_state)
    num = sum(float(np.sum((ds_state[k] - meg_state[k]) ** 2)) for k in ds_state)
    den = sum(float(np.sum(meg_state[k] ** 2)) for k in ds_state)
    assert np.sqrt(num / den) <= 1e-4
    worst = max(float(np.max(np.abs(ds_state[k] - meg_state[k]))) for k in ds_state)
    assert worst <= 3 * ADAM_LR


@pytest.mark.parametrize("stage", [1, 2])
def test_forced_dp_change_repartitions_live_and_is_exact(runs: Any, stage: int) -> None:
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
    # the same samples; the reported losses are sums over the replicas (another order at dp 1)
    assert forced["rewards"] == base["rewards"] and forced["lengths"] == base["lengths"]
    for a, b in zip(forced["losses"], base["losses"], strict=True):
        for k in ("actor-train", "critic-train"):
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9)
    assert set(forced_state) == set(base_state)
    for k in base_state:
        assert np.array_equal(forced_state[k], base_state[k]), k
