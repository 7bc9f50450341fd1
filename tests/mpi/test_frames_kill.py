"""Node 0 — rank 0, the controller, and rank 1 — SIGKILLed inside each kind of control-plane
message of a running ``nereus run`` (ULFM, 3 nodes x 2 ranks, tiny PPO, 2 steps).

The framing layer's test knob (``NEREUS_TEST_FRAME_KILL``, :mod:`nereus.runtime.mpi.frames`)
stops node 0's ranks at a chosen point of the n-th message of a kind: ``before`` any byte of it,
after its ``prefix``, with the payload ``torn`` (its second half zero-filled: issue #25's
garbled broadcast), after the ``payload`` and after the ``agreed`` digest. Kinds: the ``step``
broadcast, the step's ``exchange`` all-gathers (generated batch, inference results, losses), the
``measure`` gather, the ``plan`` broadcast (the order after step 0), the controller's
``replica`` broadcast and the checkpoint's ``state`` gather. Each run must end (exit 0) without a
relaunch, on the reference's rewards, lengths, losses and parameters, with one ``rank-failure``
event naming exactly the ranks that died and the state taken from the surviving replicas (a
replica of every model-stage survives node 0 in this plan). A survivor that acted on a partial
message would not end on the reference, or would fail on its own and end the job.

By default every kind is killed once, every point used at least once (6 runs, about 1 min each
on 2 busy cores); ``NEREUS_FRAME_KILL_CASES=pairs`` kills every kind at ``torn`` and at one other
point (12 runs), ``NEREUS_FRAME_KILL_CASES=all`` every kind at every point (30 runs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.failure_runs import failure_events, same_training, summary, two_step_job
from support.paths import REPO

from nereus.runtime.mpi.frames import KILL_ENV, POINTS
from nereus.spec.workflow import build_workflow

pytestmark = [pytest.mark.mpi, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("mpiexec") is None,
                                 reason="needs mpiexec (the mpi extra)")]
# kind → which message of that kind node 0 dies in (1-based, counted from the start of the run):
# step 1's step broadcast, step 0's inference exchange, the measurements and order after step 0
# (the order is the second plan message: the first is the initial plan), the first controller
# replica and the checkpoint after step 0 (the first is the one before step 0).
KINDS = {"step": 2, "exchange": 2, "measure": 1, "plan": 2, "replica": 1, "state": 2}
OTHER = dict(zip(KINDS, ("before", "prefix", "payload", "agreed", "prefix", "payload"),
                 strict=True))
# The suite's default: every kind once and every point at least once (6 runs; torn, issue #25's
# case, twice); ``pairs``: every kind at ``torn`` and at its OTHER point (12 runs).
ONCE = {"step": "torn", "exchange": "prefix", "measure": "payload", "plan": "agreed",
        "replica": "torn", "state": "before"}
_CASES_ENV = os.environ.get("NEREUS_FRAME_KILL_CASES", "")
CASES = ([(k, p) for k in KINDS for p in POINTS] if _CASES_ENV == "all"
         else [(k, p) for k in KINDS for p in ("torn", OTHER[k])] if _CASES_ENV == "pairs"
         else list(ONCE.items()))


def _run(tmp: Path, name: str, runtime: str, kill: dict[str, Any] | None = None
         ) -> subprocess.CompletedProcess[str]:
    cfg = two_step_job(tmp, name, runtime)
    env = dict(os.environ)
    env.pop(KILL_ENV, None)
    if kill is not None:
        env[KILL_ENV] = json.dumps(kill)
    return subprocess.run([sys.executable, "-m", "nereus", "run", str(cfg), "--log",
                           str(tmp / f"{name}.h5"), "--json", "--timeout-s", "400"],
                          capture_output=True, text=True, timeout=460, cwd=REPO, env=env)


@pytest.fixture(scope="module")
def reference(six_rank_reference: tuple[dict[str, Any], Any, Any]
              ) -> tuple[dict[str, Any], Any, Any]:
    """The uninterrupted run of the same job (``adapt: false``), shared with
    slurm/test_failures_random.py (support.failure_runs.six_rank_reference)."""
    return six_rank_reference


def _replica_survives(plan: dict[str, Any], dead: set[int]) -> bool:
    """Every model-stage keeps a replica, or (a frozen copy) its trained source does: the
    recovery's rule (Workflow.lost_stages; the job is synchronous PPO)."""
    alive = {sp["name"]: any(not dead & set(r) for r in sp["replicas"]) for sp in plan["stages"]}
    return not build_workflow("ppo").lost_stages(alive)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("kind", "point"), CASES)
def test_node_of_the_sender_killed_inside_a_control_plane_message(
        kind: str, point: str, tmp_path: Path, reference: tuple[dict[str, Any], Any, Any]
) -> None:
    stamp = tmp_path / "frame.kills"
    res = _run(tmp_path, "k", "failures: {checkpoint_every: 1}",
               {"kind": kind, "at": KINDS[kind], "point": point, "ranks": [0, 1],
                "stamp": str(stamp)})
    ended_at = time.time()
    where = (kind, point, res.stderr[-3000:])
    out = summary(res)
    assert out["relaunches"] == 0, where  # ULFM survived the node: no relaunch
    assert "NEREUS-RANK-ERROR" not in res.stderr, where  # no survivor failed on its own
    same_training(reference[0], out, reference[1], np.load(tmp_path / "k.npz"))
    lines = [ln.split() for ln in stamp.read_text().splitlines()]
    dead = {int(ln[0]) for ln in lines}
    assert dead == {0, 1}, where
    assert ended_at - min(float(ln[1]) for ln in lines) < 240, where  # no hang
    events = [e for p in sorted(tmp_path.glob("k.after-failure-*.h5")) for e in failure_events(p)]
    assert len(events) == 1 and set(events[0]["lost_ranks"]) == dead, (events, where)
    survived = _replica_survives(reference[2], dead)
    assert survived, reference[2]  # the plan keeps a replica of every model-stage off node 0
    assert events[0]["restored_from"] == "replicas", (events, where)
