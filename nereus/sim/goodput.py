"""Goodput of a long job under node failures: survive-and-replan against checkpoint/restart
(pure: numpy's seeded generator, no clock; issue 37, ``benchmarks/failures_at_scale.py``).

**Failures.** Every node fails as a Poisson process of rate ``node_rate_per_s`` while it is up;
a failed node is back (repaired or replaced) after an exponential time of mean
``repair_mean_s``, and can fail again. Both paths see the same draws (:func:`draw_events`).

**Time.** The job runs whole steps. With ``k`` nodes down a step takes ``step_s[k]`` (the plan
each path runs on that pool; ``step_s[0]`` is the failure-free step). A failure loses the step in
flight (its work so far) on both paths.

**Survive and replan** (Nereus): at a failure the survivors detect it, rebuild the data plane
from the surviving replicas (``survive_s``: detection, rebuild, the controller's decision and
the order's broadcast) and run the transition DAG into the plan for ``k`` nodes down
(``down_s[k]``); no completed step is lost. When a node comes back, the controller replans at
the next step boundary and admits the growth only if it pays back (DESIGN §2.1:
``L̂_tran / ΔL ≤ γ · H`` with H the moving average of steps between pool changes; before any
interval is seen H = 1 step); of the targets that pay back, the one with the best payback value
ΔL·H − L̂_tran is admitted, as ``admit_opportunistic`` does (its tie rule left out: the
targets' stage times are not passed here); the admitted one's transition runs.

**Checkpoint/restart** (what every peer uses): a checkpoint blocks the job ``checkpoint_s``
every ``interval_s`` of work (Young/Daly: :func:`daly_interval_s`). At a failure the work since
the last checkpoint is lost, and the job is down ``restart_s`` (detection, start-up, reading the
checkpoint, communicators) before it resumes on the survivors (the best plan for ``k`` nodes
down, resharded by the restart). A node that comes back is taken at the next checkpoint by a
planned restart (``restart_s``, nothing lost) — restart's best: no other way to grow.

**Goodput** = useful step time / wall time, where a kept step counts ``step_s[0]`` (what it takes
on the whole pool): 1.0 for a failure-free run at full size; a slower plan on fewer nodes, lost
work, checkpoints, restarts and transitions all lower it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

FAIL, REPAIR = "fail", "repair"


@dataclass(frozen=True)
class Event:
    time_s: float
    kind: str  # fail | repair
    node: int


def draw_events(nodes: int, node_rate_per_s: float, repair_mean_s: float, horizon_s: float,
                seed: int) -> tuple[Event, ...]:
    """Failures and repairs of ``nodes`` nodes within ``horizon_s`` (sorted by time)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    out: list[Event] = []
    for node in range(nodes):
        t = 0.0
        while True:
            t += float(rng.exponential(1.0 / node_rate_per_s))
            if t >= horizon_s:
                break
            out.append(Event(t, FAIL, node))
            t += float(rng.exponential(repair_mean_s))
            if t >= horizon_s:
                break
            out.append(Event(t, REPAIR, node))
    out.sort(key=lambda e: (e.time_s, e.kind, e.node))
    return tuple(out)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's optimum checkpoint interval (work between checkpoints) for a checkpoint costing
    ``checkpoint_s`` and a mean time between failures ``mtbf_s`` (J. T. Daly, "A higher order
    estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3), 2006; Young's
    ``sqrt(2·δ·M)`` to first order)."""
    d, m = checkpoint_s, mtbf_s
    if d >= 2.0 * m:
        return m
    x = d / (2.0 * m)
    return math.sqrt(2.0 * d * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - d


@dataclass(frozen=True)
class Outcome:
    """One path over one draw: ``wall_s`` always the horizon."""

    goodput: float
    steps_kept: int
    steps_lost: int  # completed steps whose work was lost (restart: since the last checkpoint)
    failures: int
    transition_s: float  # survive: rebuild + transitions; restart: restarts
    checkpoint_s: float
    lost_work_s: float  # work thrown away (steps in flight, steps since the checkpoint)
    degraded_s: float  # wall time on fewer nodes than the whole pool


def _step_s(step_s: Sequence[float], down: int) -> float:
    if down >= len(step_s):
        raise ValueError(f"{down} nodes down: no plan given (step_s has {len(step_s)})")
    return step_s[down]


def _ordered(events: Sequence[Event]) -> list[Event]:
    return sorted(events, key=lambda e: (e.time_s, e.kind, e.node))


def survive(events: Sequence[Event], nodes: int, horizon_s: float, step_s: Sequence[float],
            survive_s: float, down_s: Sequence[float],
            grow: Sequence[Sequence[tuple[float, float]]],
            gamma: float = 0.5, horizon_alpha: float = 0.5) -> Outcome:
    """The survive-and-replan path (module docstring). ``down_s[k]``: the transition into the
    plan for ``k`` nodes down (``step_s[k]``) from the one for ``k − 1``; ``grow[k]``: the
    controller's options when nodes come back to the plan for ``k`` down, ``(step seconds,
    transition seconds)`` fastest first — of those that pay back, the best payback value is
    admitted (ties: the faster), as ``admit_opportunistic`` ranks S* and the slower targets
    with cheaper transitions (index 0 unused). A failure of a node the running plan does not use (one back but not yet
    taken) costs nothing."""
    up = set(range(nodes))
    used = set(up)  # the nodes the running plan is placed on
    cur_s = step_s[0]  # the running plan's step
    t, steps = 0.0, 0
    failures = 0
    trans = lost = degraded = 0.0
    h_steps, last_change, seen = 1.0, -1, 0  # the pool signal's horizon H (steps)
    growing = False
    evs = _ordered(events)
    i = 0
    while t < horizon_s:
        plan_down = nodes - len(used)
        if growing and len(up) > len(used):  # the controller's pass at a step boundary
            able = [((cur_s - target_s) * h_steps - cost, -target_s, target_s, cost)
                    for target_s, cost in grow[plan_down]
                    if cur_s - target_s > 0 and cost / (cur_s - target_s) <= gamma * h_steps]
            if able:
                _, _, target_s, cost = max(able)
                t += cost
                trans += cost
                used, cur_s = set(up), target_s
            growing = False
            continue
        end = t + cur_s
        if i < len(evs) and evs[i].time_s < end:
            ev = evs[i]
            i += 1
            if last_change >= 0:  # the pool changed: H learns the interval since the last
                interval = float(max(steps - last_change, 1))
                h_steps = interval if seen == 0 else (
                    horizon_alpha * interval + (1 - horizon_alpha) * h_steps)
                seen += 1
            last_change = steps
            if ev.kind == REPAIR:
                up.add(ev.node)
                growing = True  # decided after the step in flight
                continue
            up.discard(ev.node)
            if ev.node not in used:
                continue
            failures += 1
            used.discard(ev.node)
            at = max(ev.time_s, t)  # a failure during a recovery: the next one starts after it
            if plan_down > 0:
                degraded += at - t
            lost += at - t  # the step in flight, redone after the recovery
            k = nodes - len(used)
            cur_s = _step_s(step_s, k)  # a plan for that many nodes down exists
            cost = survive_s + down_s[k]
            t = at + cost
            trans += cost
            continue
        if end > horizon_s:  # the step would end past the horizon: not counted
            break
        if plan_down > 0:
            degraded += cur_s
        t = end
        steps += 1
    return Outcome(steps * step_s[0] / horizon_s, steps, 0, failures, trans, 0.0, lost, degraded)


def restart(events: Sequence[Event], nodes: int, horizon_s: float, step_s: Sequence[float],
            restart_s: float, checkpoint_s: float, interval_s: float) -> Outcome:
    """The checkpoint/restart path (module docstring): a checkpoint after the step that
    completes ``interval_s`` of work since the last one."""
    up = set(range(nodes))
    used = set(up)
    t, steps, saved = 0.0, 0, 0
    since = 0.0  # work since the last checkpoint
    failures = steps_lost = 0
    trans = ckpt = lost = degraded = 0.0
    evs = _ordered(events)
    i = 0
    while t < horizon_s:
        plan_down = nodes - len(used)
        s = _step_s(step_s, plan_down)
        end = t + s
        if i < len(evs) and evs[i].time_s < end:
            ev = evs[i]
            i += 1
            if ev.kind == REPAIR:  # taken at the next checkpoint's planned restart
                up.add(ev.node)
                continue
            up.discard(ev.node)
            if ev.node not in used:
                continue
            failures += 1
            at = max(ev.time_s, t)  # a failure during a restart: the next one starts after it
            if plan_down > 0:
                degraded += at - t
            lost += at - t + since
            steps_lost += steps - saved
            steps, since = saved, 0.0
            t = at + restart_s  # relaunched on the nodes up (resharded)
            trans += restart_s
            used = set(up)
            continue
        if end > horizon_s:
            break
        if plan_down > 0:
            degraded += s
        t = end
        steps += 1
        since += s
        if since >= interval_s:
            t += checkpoint_s
            ckpt += checkpoint_s
            saved, since = steps, 0.0
            if len(up) > len(used):  # nodes came back: a planned restart onto them
                t += restart_s
                trans += restart_s
                used = set(up)
    return Outcome(steps * step_s[0] / horizon_s, steps, steps_lost, failures, trans, ckpt,
                   lost, degraded)


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (Student's t)."""
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if n < 2:
        return float(x.mean()) if n else math.nan, math.nan
    t95 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306,
           10: 2.262, 11: 2.228, 12: 2.201, 13: 2.179, 14: 2.160, 15: 2.145, 16: 2.131,
           17: 2.120, 18: 2.110, 19: 2.101, 20: 2.093, 21: 2.086, 26: 2.060, 31: 2.042}
    key = max(k for k in t95 if k <= n)
    return float(x.mean()), float(t95[key] * x.std(ddof=1) / math.sqrt(n))
