"""The price of a plan change that moves nothing (smaller micro-batches, recomputation: the
same units on the same GPUs) and how the live calibration learns it.

The ranks keep every unit and DP group through such a change (ranks/test_plan_change_keep_gloo.py),
so what it costs is the per-change fixed cost alone: its DAG has no primitive, L̂_tran is the
calibrated ``transition`` fixed cost, and its measured time is a sample of that one parameter —
it moves nothing else the fit holds (links, communicator set-up, unit builds).
"""

from __future__ import annotations

import pytest
from support.dag_cases import SETUP

from nereus.cost.calibration import default_calibration
from nereus.cost.fit import Sample, fit
from nereus.spec.plan import ExecutionPlan, StagePlan
from nereus.transition.cost import (
    TRANSITION_EVENTS,
    path_features,
    rates,
    transition_cost_s,
    transition_sample,
)
from nereus.transition.planned import plan_transition

TRAIN = StagePlan("actor-train", 2, 1, 2, 2, 2, replicas=((0, 1), (2, 3)))
GEN = StagePlan("actor-gen", 1, 1, 4, 2, 1, replicas=((0,), (1,), (2,), (3,)))
SOURCE = ExecutionPlan((TRAIN, GEN))
NO_MOVE = ExecutionPlan((StagePlan("actor-train", 2, 1, 2, 1, 4, recompute=True,
                                   replicas=TRAIN.replicas), GEN))
GEN_MOVES = ExecutionPlan((TRAIN, StagePlan("actor-gen", 2, 1, 2, 4, 1,
                                            replicas=((0, 1), (2, 3)))))
CL = SETUP.cluster


def _refit(calib, samples):  # type: ignore[no-untyped-def]
    """What rank 0 does at the next boundary with the transition samples (rank0/loop.py)."""
    gpu = CL.gpu
    fixed = {k: calib.fixed_s(gpu, k) for k in TRANSITION_EVENTS}
    inv = {k: 1.0 for k in ("p2p-intra", "p2p-inter")}
    effs, fixed_s = fit(samples, inv, fixed)
    return calib.with_fit(gpu, {k: 1.0 / v for k, v in effs.items()}, fixed_s)


def test_a_change_that_moves_nothing_costs_the_fixed_cost_of_a_change_alone() -> None:
    calib = default_calibration()
    planned = plan_transition(SETUP, SOURCE, NO_MOVE, calib=calib)
    dag = planned.dag
    assert planned.executor == "dag" and dag.primitives == ()
    assert planned.cost_s == transition_cost_s(dag, CL, calib) == rates(CL, calib).fixed_s
    ideal, counts = path_features(dag, CL, calib)
    assert not any(ideal.values())
    assert counts == {"comm-setup": 0.0, "transition": 1.0, "unit-build": 0.0}
    assert transition_sample(dag, "dag", 0, 4, CL, calib, 0.003) == (ideal, counts)


@pytest.mark.parametrize("measured_s", [0.002, 0.05, 0.9])
def test_the_measured_no_move_change_calibrates_that_cost_and_nothing_else(
        measured_s: float) -> None:
    """One measured no-move change: the next one is predicted nearer its time — at it (within
    5%) where it took no longer than the prior (the fit's ridge prior, relative to the current
    value, lets a cost fall at once but rise only part of the way per sample:
    :mod:`nereus.cost.fit`) — and a change that moves a model-stage keeps its other parameters
    (links, set-up, builds)."""
    calib = default_calibration()
    nomove = plan_transition(SETUP, SOURCE, NO_MOVE, calib=calib)
    moving = plan_transition(SETUP, SOURCE, GEN_MOVES, calib=calib)
    assert moving.dag.primitives  # actor-gen goes from tp 1 to tp 2
    got = transition_sample(nomove.dag, "dag", 0, 6, CL, calib, measured_s)
    assert got is not None
    sample = Sample(tuple(sorted(got[0].items())), tuple(sorted(got[1].items())), measured_s)
    after = _refit(calib, [sample])
    r0, r1 = rates(CL, calib), rates(CL, after)
    predicted = plan_transition(SETUP, SOURCE, NO_MOVE, calib=after).cost_s
    if measured_s <= r0.fixed_s * 1.25:
        assert predicted == pytest.approx(measured_s, rel=0.05)
    else:
        assert r0.fixed_s < predicted < measured_s
    assert (r1.intra_bps, r1.inter_bps, r1.setup_s, r1.build_s, r1.reload_unit_s) == (
        r0.intra_bps, r0.inter_bps, r0.setup_s, r0.build_s, r0.reload_unit_s)
    assert plan_transition(SETUP, SOURCE, GEN_MOVES, calib=after).cost_s == pytest.approx(
        moving.cost_s - r0.fixed_s + r1.fixed_s)


def test_no_sample_without_a_measured_time_or_from_a_host_staged_change() -> None:
    dag = plan_transition(SETUP, SOURCE, NO_MOVE).dag
    assert transition_sample(dag, "dag", 0, 6, CL, None, 0.0) is None
    assert transition_sample(dag, "staged", 0, 6, CL, None, 0.5) is None
    ideal, counts = transition_sample(None, "gather-reload", 10**6, 6, CL, None, 0.5)
    assert counts == {"reload-unit": 6.0, "transition": 1.0} and ideal["p2p-inter"] > 0
