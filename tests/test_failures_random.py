"""Every rank of one node killed at random moments never loses state, never hangs (ULFM).

One setup (4 virtual nodes x 1 rank, tiny PPO, 2 steps, a checkpoint after every step) is run
once without failures and then once per moment: a random node dies a random time into step 0
or 1, or into the boundary after step 0 (``runtime.failures.kill``, SIGKILL). Each run must end
(exit 0, within its timeout) with the reference's rewards, lengths, losses and parameters; the
state must come from the surviving replicas exactly when one of every model-stage survived
(else from the checkpoint). ``NEREUS_FAILURE_MOMENTS`` sets the number of moments (default 20);
the draws are seeded. Runtime: about 10 s per moment on 2 quiet cores (start-up dominates).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_failures import failure_events, run, same_training, summary

from nereus.runtime.failure_recovery import COPIES

pytestmark = [pytest.mark.mpi, pytest.mark.slow]
FOUR = "cluster: {nodes: 4, gpus_per_node: 1, gpu: cpu, memory_per_gpu_gb: 0.5}\n"
MOMENTS = int(os.environ.get("NEREUS_FAILURE_MOMENTS", "20"))


def _moments(n: int) -> list[tuple[int, int, str, float]]:
    rng = random.Random(7)
    return [(rng.randrange(4), rng.randrange(2), rng.choice(("step", "step", "transition")),
             round(rng.uniform(0.0, 1.5), 2)) for _ in range(n)]


def _replica_survives(plan: dict[str, Any], dead: set[int]) -> bool:
    alive = {sp["name"] for sp in plan["stages"]
             if any(not dead & set(r) for r in sp["replicas"])}
    return all(sp["name"] in alive or COPIES.get(sp["name"]) in alive for sp in plan["stages"])


@pytest.mark.timeout(1800)  # 21 runs of 4 ranks: ~10 min on 2 quiet cores
def test_random_node_deaths(tmp_path: Path) -> None:
    from nereus.log.reader import read_run_log

    res, _ = run(tmp_path, "ref", FOUR, "adapt: false", steps=2)
    ref, xref = summary(res), np.load(tmp_path / "ref.npz")
    plan = read_run_log(tmp_path / "ref.h5").initial_plan
    for i, (node, step, phase, after_s) in enumerate(_moments(MOMENTS)):
        name = f"m{i}"
        res, _ = run(tmp_path, name, FOUR,
                     f"failures: {{checkpoint_every: 1, kill: [{{node: {node}, at_step: "
                     f"{step}, phase: {phase}, after_s: {after_s}}}]}}", steps=2)
        ended_at = time.time()
        where = (name, node, step, phase, after_s, res.stderr[-2000:])
        out = summary(res)
        same_training(ref, out, xref, np.load(tmp_path / f"{name}.npz"))
        events = failure_events(tmp_path / f"{name}.h5")
        if not (tmp_path / f"{name}.h5.kills").exists():
            assert not events, where  # the run ended before the moment came
            continue
        if node == 0:  # the controller died: the rest of the run is in the successor's log
            events = [e for p in sorted(tmp_path.glob(f"{name}.after-failure-*.h5"))
                      for e in failure_events(p)]
        assert len(events) == 1 and events[0]["lost_ranks"] == [node], where
        killed_at = float((tmp_path / f"{name}.h5.kills").read_text().split()[1])
        assert ended_at - killed_at < 180, where  # no hang after the death
        survived = _replica_survives(plan, {node})
        assert (events[0]["restored_from"] == "replicas") == survived, where
