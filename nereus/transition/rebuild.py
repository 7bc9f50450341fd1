"""Lost frozen copies rebuilt from their source's surviving replica (pure; issue 32).

A frozen copy of a trained model-stage (actor-gen of actor-train, critic-inf of critic-train:
:meth:`nereus.spec.workflow.Workflow.copy_source`) holds its source's parameters after every
step's weight sync, and plan changes happen at step boundaries, after it. So when a shrink takes
every replica of the copy but its source keeps one, no state is lost: the copy's target units
can be built from the source's. The change then runs in two legs:

1. **the rest** — every other model-stage changes by its ordinary DAG (or, where device memory
   blocks every order of it, the host-staged one: :mod:`nereus.transition.staged`), compiled
   and memory-checked without the rebuilt copies, which hold no device memory meanwhile;
2. **rebuild** — every target unit of a rebuilt copy is created empty and filled by the weight
   sync's own transfer plan (parameters only,
   :func:`nereus.emu.transfer.weight_sync_plan`) from the source's target units, which the
   first leg left in place.

Without it such a change needs gather-and-reload, which puts the whole logical state in every
rank's host memory (273 GB for an 8B PPO job: more than a node has), so at scale it was a
checkpoint/restart. Costs (seconds, after the first leg): per copy target unit a communicator
and a unit build, and the busiest GPU's transfer — each copy unit reads its shards from one
source unit (the one sharing most of its nodes, the fewest readers first), at the slowest link
between the two units' nodes; a GPU's time is the larger of what it sends and what it
receives. The ranks' weight sync may read from several source units (its transfer plan's own
choice); the estimate is not calibrated from such changes (their measured time includes the
sync, which no DAG feature holds). Device memory: the rest's DAG is checked
by its compiler; the end state (every target unit) must fit each GPU.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from nereus.cost.calibration import Calibration
from nereus.emu.primitives import shard_bytes
from nereus.emu.unit import Emu, emus_of_plan
from nereus.errors import InfeasiblePlanError, TransitionError
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan
from nereus.transition.cost import Links, rates
from nereus.transition.planned import (
    PlannedTransition,
    check_target_fits,
    device_capacity,
    job_sizers,
    plan_plans,
    plan_without,
    stage_states,
)
from nereus.transition.staged import plan_staged


@dataclass(frozen=True)
class CopyRebuild:
    """One frozen copy rebuilt after the DAG: its ``targets`` (the target plan's units) are
    filled from ``feeds`` (one unit of ``source`` per target, in the same order)."""

    model_stage: str
    source: str
    targets: tuple[Emu, ...]
    feeds: tuple[Emu, ...]


def rebuildable(setup: Setup, current: ExecutionPlan, pool: Collection[int] | None
                ) -> tuple[list[str], list[str]]:
    """(the model-stages of ``current`` with no replica on ``pool``, those of them that are
    frozen copies whose source kept a replica there)."""
    alive = None if pool is None else set(pool)
    have = {sp.name: any(alive is None or alive.issuperset(r) for r in sp.replicas)
            for sp in current.stages}
    lost = sorted(n for n, ok in have.items() if not ok)
    gone = setup.job.workflow.lost_stages(have)  # the rule gather-and-reload's check uses too
    return lost, [n for n in lost if n not in gone]


def _feeds(targets: Sequence[Emu], sources: Sequence[Emu], gpn: int) -> tuple[Emu, ...]:
    """One source unit per target: the one sharing most of its nodes, fewest readers first."""
    readers = dict.fromkeys(sources, 0)
    out = []
    for v in targets:
        nodes = {g // gpn for g in v.gpus}
        best = min(sources, key=lambda u: (-len(nodes.intersection(g // gpn for g in u.gpus)),
                                           readers[u], u.gpus))
        readers[best] += 1
        out.append(best)
    return tuple(out)


def _per_node(gpus: Sequence[int], gpn: int) -> list[int]:
    """One GPU of each node ``gpus`` span (a link class per pair of nodes)."""
    return list({g // gpn: g for g in gpus}.values())


def rebuild_s(setup: Setup, rebuilt: Sequence[CopyRebuild],
              calib: Calibration | None = None) -> float:
    """Seconds of the rebuild leg (module docstring)."""
    cl = setup.cluster
    sizer, replicated = job_sizers(setup.job)
    links = Links(cl, calib)
    gpn = cl.gpus_per_node
    send: dict[int, float] = {}
    recv: dict[int, float] = {}
    units = 0
    for rb in rebuilt:
        state, rep = sizer(rb.model_stage), replicated(rb.model_stage)
        for v, u in zip(rb.targets, rb.feeds, strict=True):
            units += 1
            b = shard_bytes(state, v.layout, rep)
            bps = min(links.bps(a, z) for a in _per_node(u.gpus, gpn)
                      for z in _per_node(v.gpus, gpn))
            for g in v.gpus:
                recv[g] = recv.get(g, 0.0) + b / bps
            for g in u.gpus:  # each source position sends its slice to the matching position
                send[g] = send.get(g, 0.0) + b * v.layout.size / u.layout.size / bps
    r = rates(cl, calib)
    return units * (r.setup_s + r.build_s) + max([*send.values(), *recv.values(), 0.0])


def plan_rebuild(setup: Setup, current: ExecutionPlan, target: ExecutionPlan,
                 pool: Sequence[int] | None = None, calib: Calibration | None = None,
                 *, staging: bool = True) -> PlannedTransition:
    """The change from the units of ``current`` alive on ``pool`` to ``target`` where every
    model-stage that lost its last replica is a frozen copy whose source kept one: the rest by
    its DAG (or, with ``staging``, host-staged), then the copies rebuilt (module docstring).
    TransitionError when some lost model-stage is not such a copy, or the rest has no DAG."""
    lost, copies = rebuildable(setup, current, pool)
    if not copies or len(copies) != len(lost):
        gone = sorted(set(lost) - set(copies)) or lost
        raise TransitionError(f"every replica of {', '.join(gone)} was lost")
    wf = setup.job.workflow
    cl = setup.cluster
    sizer, replicated = job_sizers(setup.job)
    states = stage_states(setup)
    alive = None if pool is None else set(pool)
    cur_rest, tgt_rest = plan_without(current, copies), plan_without(target, copies)
    if not tgt_rest.stages:
        raise TransitionError(f"every replica of {', '.join(copies)} was lost with no "
                              "source in the target")
    capacity = device_capacity(setup)
    try:
        rest = plan_plans(cur_rest, tgt_rest, states, sizer, cl, capacity_bytes=capacity,
                          conflicts=wf.concurrent, replicated=replicated, alive=alive,
                          calib=calib)
    except (TransitionError, InfeasiblePlanError) as e:
        if not staging:
            raise
        rest = plan_staged(setup, cur_rest, tgt_rest, pool, calib, str(e))
    tgt_units = emus_of_plan(target, states)
    rebuilt = []
    for name in copies:
        src = wf.copy_source(name)
        assert src is not None
        targets = tuple(v for v in tgt_units if v.model_stage == name)
        sources = [v for v in tgt_units if v.model_stage == src]
        if not sources:
            raise TransitionError(f"{name} is rebuilt from {src}, which the target does not "
                                  "place")
        rebuilt.append(CopyRebuild(name, src, targets, _feeds(targets, sources,
                                                               cl.gpus_per_node)))
    check_target_fits(setup, target, capacity)
    return replace(rest, cost_s=rest.cost_s + rebuild_s(setup, rebuilt, calib),
                   rebuilt=tuple(rebuilt))

