"""The goodput simulator of benchmarks/failures_at_scale.py (nereus.sim.goodput): hand-computed
cases for both paths, Daly's interval, and the failure draws against their Poisson rate."""

from __future__ import annotations

import math

import pytest

from nereus.sim.goodput import (
    FAIL,
    REPAIR,
    Event,
    daly_interval_s,
    draw_events,
    mean_ci95,
    restart,
    survive,
)

STEP = [10.0, 12.0, 15.0]  # step seconds with 0, 1, 2 nodes down
G1 = [[], [(10.0, 1.0)], [(12.0, 1.0)]]  # growth back: one target each, 1 s transitions


def test_no_failures_survive_keeps_every_step_restart_pays_its_checkpoints() -> None:
    s = survive((), 4, 1000.0, STEP, survive_s=5.0, down_s=[0, 1, 1], grow=G1)
    assert (s.steps_kept, s.failures, s.transition_s) == (100, 0, 0.0)
    assert s.goodput == pytest.approx(1.0)
    r = restart((), 4, 1000.0, STEP, restart_s=50.0, checkpoint_s=2.0, interval_s=40.0)
    # a checkpoint (2 s) after every 4 steps: 23 blocks of 42 s end at 966 s (92 steps), then
    # steps end at 976, 986, 996; the next would end past the horizon
    assert (r.steps_kept, r.checkpoint_s) == (95, 46.0)
    assert r.goodput == pytest.approx(0.95)


def test_one_failure_survive_loses_the_step_in_flight_restart_since_its_checkpoint() -> None:
    ev = (Event(105.0, FAIL, 2),)  # 5 s into step 10 (steps end at 10, 20, ..., 100)
    s = survive(ev, 4, 1000.0, STEP, survive_s=3.0, down_s=[0, 7.0, 9.0], grow=G1)
    # lost: 5 s in flight; recovery 3 + 7 s; then 12 s steps from t = 115: 73 steps to 991
    assert (s.failures, s.steps_lost, s.lost_work_s, s.transition_s) == (1, 0, 5.0, 10.0)
    assert s.steps_kept == 10 + math.floor((1000.0 - 115.0) / 12.0)
    assert s.degraded_s == pytest.approx((1000.0 - 115.0) // 12 * 12.0)
    r = restart(ev, 4, 1000.0, STEP, restart_s=50.0, checkpoint_s=2.0, interval_s=40.0)
    # checkpoints after steps 4 and 8 (t = 42, 84); the failure at 105 loses steps 9, 10
    # (t 84..104) and 1 s in flight: 21 s of work, 2 steps
    assert (r.failures, r.steps_lost) == (1, 2)
    assert r.lost_work_s == pytest.approx(105.0 - 104.0 + 20.0)
    assert r.transition_s == 50.0


def test_growth_is_admitted_only_when_it_pays_back() -> None:
    ev = (Event(105.0, FAIL, 2), Event(300.0, REPAIR, 2))
    dear = [[], [(10.0, 100.0)], [(12.0, 100.0)]]
    never = survive(ev, 4, 2000.0, STEP, 0.0, [0, 0.0, 0.0], dear, gamma=0.0)
    assert never.degraded_s > 1500.0  # stays on 3 nodes
    # H = steps between the two pool changes (about 17): 100 s / 2 s gain = 50 > 0.5·17
    refused = survive(ev, 4, 2000.0, STEP, 0.0, [0, 0.0, 0.0], dear, gamma=0.5)
    assert refused.degraded_s > 1500.0
    cheap = survive(ev, 4, 2000.0, STEP, 0.0, [0, 0.0, 0.0], [[], [(10.0, 4.0)], []], gamma=0.5)
    assert cheap.degraded_s < 250.0 and cheap.transition_s == pytest.approx(4.0)
    assert cheap.steps_kept > refused.steps_kept
    # S* too dear, a slower target with a cheap transition admitted instead (10.5 s steps)
    fallback = survive(ev, 4, 2000.0, STEP, 0.0, [0, 0.0, 0.0],
                       [[], [(10.0, 100.0), (10.5, 1.0)], []], gamma=0.5)
    assert fallback.transition_s == pytest.approx(1.0)
    assert refused.steps_kept < fallback.steps_kept < cheap.steps_kept
    # both pay back (S*: 10 s / 2 s gain = 5 steps ≤ 0.5·H): the best payback value ΔL·H −
    # L̂_tran wins, as admit_opportunistic ranks them — here the slower target's, 1.8·H − 1 >
    # 2·H − 10 for H < 45 — not the first that pays back
    best = survive(ev, 4, 2000.0, STEP, 0.0, [0, 0.0, 0.0],
                   [[], [(10.0, 10.0), (10.2, 1.0)], []], gamma=0.5)
    assert best.transition_s == pytest.approx(1.0)


def test_a_failure_of_an_idle_node_costs_nothing() -> None:
    # node 2 fails, comes back (growth refused: gamma 0), fails again while idle
    ev = (Event(105.0, FAIL, 2), Event(300.0, REPAIR, 2), Event(500.0, FAIL, 2))
    s = survive(ev, 4, 2000.0, STEP, 1.0, [0, 0.0, 0.0], G1, gamma=0.0)
    assert s.failures == 1 and s.transition_s == 1.0


def test_restart_takes_returned_nodes_at_the_next_checkpoint() -> None:
    ev = (Event(105.0, FAIL, 2), Event(300.0, REPAIR, 2))
    r = restart(ev, 4, 2000.0, STEP, restart_s=50.0, checkpoint_s=2.0, interval_s=40.0)
    assert r.transition_s == 100.0  # the failure's restart and the planned one onto node 2
    assert r.degraded_s < 400.0


def test_daly_interval() -> None:
    d, m = 10.0, 100_000.0
    assert daly_interval_s(d, m) == pytest.approx(math.sqrt(2 * d * m), rel=0.02)
    assert daly_interval_s(d, m) < math.sqrt(2 * d * m)  # Daly subtracts the dump itself
    assert daly_interval_s(300.0, 100.0) == 100.0  # δ ≥ 2M: checkpoint every MTBF


def test_failure_draws_follow_the_poisson_rate() -> None:
    nodes, rate, horizon = 2048, 419 / (54 * 86400.0 * 2048), 7 * 86400.0
    counts = [sum(e.kind == FAIL for e in draw_events(nodes, rate, 4 * 3600.0, horizon, seed))
              for seed in range(10)]
    expected = nodes * rate * horizon  # 54.3 (repairs take ≪ 1% of a node's time)
    mean, half = mean_ci95(counts)
    assert abs(mean - expected) < 4 * math.sqrt(expected / len(counts))
    assert half > 0
    ev = draw_events(nodes, rate, 4 * 3600.0, horizon, 0)
    assert list(ev) == sorted(ev, key=lambda e: (e.time_s, e.kind, e.node))
    assert ev == draw_events(nodes, rate, 4 * 3600.0, horizon, 0)  # deterministic
    down: dict[int, bool] = {}
    for e in ev:  # a node fails only when up and is repaired only when down
        assert down.get(e.node, False) == (e.kind == REPAIR)
        down[e.node] = e.kind == FAIL
