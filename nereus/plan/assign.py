"""Node-aware GPU assignment of chosen candidates (pure, deterministic).

Rules, in the order they are applied:

1. A replica of ``tp·pp ≤ gpus_per_node`` GPUs lies inside one node (so its TP groups and PP
   boundaries stay on the intra-node link, as the latency model assumes); a larger replica fills
   whole nodes, its pipeline stages in node order.
2. Lanes run concurrently, so they get disjoint GPUs: each lane's *envelope* (per block level s,
   the most GPUs any of its phases needs in blocks of size ≥ s) is packed into nodes largest block
   first, best fit; GPUs left over join the last lane. Phases of a lane run one after another
   and reuse the lane's GPUs; the
   model-stages of one phase get disjoint GPUs, placed largest block first.
3. Replicas of generation and inference model-stages, and of training model-stages that already
   span nodes, are spread over nodes (fewest replicas of that model-stage first) so that a node
   loss leaves a replica where possible; a training model-stage that fits one node is kept in one
   node where possible, because its gradient all-reduce is predicted on the intra-node link.

With power-of-two block sizes, largest-first placement into any node with room succeeds whenever
``Σ_lanes D_l[s] ≤ Σ_n s·⌊a_n/s⌋`` holds for every level s (``nereus.plan.problem``), so
``assign`` only fails on plans that break the GPU budgets.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

import numpy as np

from nereus.errors import InfeasiblePlanError
from nereus.plan.candidates import granule, powers_of_two
from nereus.spec.job import Setup
from nereus.spec.plan import Candidate, ExecutionPlan, StagePlan
from nereus.spec.workflow import Workflow


def _lane_envelope(
    lane: Sequence[Sequence[str]], choice: Mapping[str, Candidate], gpn: int
) -> list[int]:
    """Block sizes (largest first) that hold every phase of the lane."""
    levels = powers_of_two(gpn)
    demand = []
    for s in levels:
        demand.append(
            max(
                sum(choice[n].num_gpus for n in phase if granule(choice[n].tp, choice[n].pp, gpn) >= s)
                for phase in lane
            )
        )
    blocks: list[int] = []
    for k in range(len(levels) - 1, -1, -1):
        above = demand[k + 1] if k + 1 < len(levels) else 0
        blocks.extend([levels[k]] * ((demand[k] - above) // levels[k]))
    return blocks


def _take(
    group: list[tuple[int, int]],
    size: int,
    spread: bool,
    room: dict[int, list[int]],
    parts: dict[int, list[int]],
) -> str | None:
    """Place the blocks ``(replica, block)`` of one model-stage; None, or what did not fit.

    Spread: the node with the fewest replicas of this model-stage, then the most room. Pack: the
    node with the most replicas of it, then the least room (best fit). Lowest node on ties.
    """
    used: dict[int, int] = {}

    def key(n: int) -> tuple[int, int, int]:
        u = used.get(n, 0)
        return (u, -len(room[n]), n) if spread else (-u, len(room[n]), n)

    heap = [(key(n), n) for n, ids in room.items() if len(ids) >= size]
    heapq.heapify(heap)
    for r, blk in group:
        if not heap:
            return f"replica {r} needs {size} GPUs in one node of its lane"
        _, node = heapq.heappop(heap)
        take, room[node] = room[node][:size], room[node][size:]
        parts.setdefault(r, []).extend(take)
        if blk == 0:
            used[node] = used.get(node, 0) + 1
        if len(room[node]) >= size:
            heapq.heappush(heap, (key(node), node))
    return None


def assign(
    setup: Setup,
    choice: Mapping[str, Candidate],
    pool: Sequence[int],
    workflow: Workflow | None = None,
    keep: ExecutionPlan | None = None,
) -> ExecutionPlan:
    """Place every chosen candidate on ``pool``; ``InfeasiblePlanError`` if it cannot fit.

    ``workflow``: ``setup.job.workflow``, if the caller has it built already. ``keep``: the
    running plan — a model-stage whose (tp, pp) stays keeps its replicas that are whole on the
    pool where they are (up to its new dp; the rest placed by the rules above on what is left),
    so a transition moves only what changes (after a node loss: no surviving unit moves). Where
    that leaves no room, the placement without it.
    """
    if keep is not None:
        try:
            return _assign(setup, choice, pool, workflow, keep)
        except InfeasiblePlanError:
            pass  # the kept replicas fragment the nodes: place everything afresh
    return _assign(setup, choice, pool, workflow, None)


def _kept(keep: ExecutionPlan | None, phase: Sequence[str], choice: Mapping[str, Candidate],
          room: dict[int, list[int]], gpn: int) -> dict[str, list[tuple[int, ...]]]:
    """The running plan's replicas the phase's model-stages keep (same tp and pp, every GPU
    free in ``room``, up to the new dp), taken out of ``room``, in their old DP rank order.

    Where the new dp keeps fewer than survive, the replicas dropped are those on the nodes that
    hold the fewest of the model-stage's surviving GPUs (ties: the node that comes last in DP
    rank order), so a shrinking model-stage frees whole nodes for the others rather than
    half-nodes that a wider replica cannot use."""
    out: dict[str, list[tuple[int, ...]]] = {}
    if keep is None:
        return out
    held = {sp.name: sp for sp in keep.stages}
    free = {g for ids in room.values() for g in ids}
    for name in phase:
        c, old = choice[name], held.get(name)
        if old is None or (old.tp, old.pp) != (c.tp, c.pp):
            continue
        whole = [tuple(rep) for rep in old.replicas if all(g in free for g in rep)]
        if len(whole) > c.dp:
            count: dict[int, int] = {}
            for rep in whole:
                for g in rep:
                    count[g // gpn] = count.get(g // gpn, 0) + 1
            first = {n: i for i, n in reversed(list(enumerate(g // gpn for r in whole for g in r)))}
            rank = {n: k for k, n in enumerate(sorted(count, key=lambda n: (-count[n], first[n])))}
            pick = sorted(range(len(whole)),
                          key=lambda i: (max(rank[g // gpn] for g in whole[i]), i))[: c.dp]
            whole = [whole[i] for i in sorted(pick)]
        for rep in whole:
            free.difference_update(rep)
        out[name] = whole
    for node in room:
        room[node] = [g for g in room[node] if g in free]
    return out


def _assign(
    setup: Setup,
    choice: Mapping[str, Candidate],
    pool: Sequence[int],
    workflow: Workflow | None,
    keep: ExecutionPlan | None,
) -> ExecutionPlan:
    gpn = setup.cluster.gpus_per_node
    wf = workflow if workflow is not None else setup.job.workflow
    free: dict[int, list[int]] = {}
    for g in sorted(pool):
        free.setdefault(g // gpn, []).append(g)
    # 1. lane envelopes into nodes, largest block first, best fit, lowest node on ties; a
    # single lane simply gets the whole pool.
    lane_gpus: list[dict[int, list[int]]] = [{} for _ in wf.lanes]
    if len(wf.lanes) > 1:
        groups: dict[tuple[int, int], int] = {}
        for li, lane in enumerate(wf.lanes):
            for size in _lane_envelope(lane, choice, gpn):
                groups[(size, li)] = groups.get((size, li), 0) + 1
        for (size, li), count in sorted(groups.items(), key=lambda g: (-g[0][0], g[0][1])):
            while count > 0:
                fits = [n for n, ids in free.items() if len(ids) >= size]
                if not fits:
                    raise InfeasiblePlanError(f"placement: no node has {size} free GPUs for lane {li}")
                node = min(fits, key=lambda n: (len(free[n]), n))
                k = min(count, len(free[node]) // size)
                take, free[node] = free[node][: k * size], free[node][k * size :]
                lane_gpus[li].setdefault(node, []).extend(take)
                count -= k
    # GPUs no envelope needs go to the last lane: more room to spread replicas over nodes.
    for node, ids in free.items():
        if ids:
            lane_gpus[-1].setdefault(node, []).extend(ids)
    # 2. phases of each lane inside the lane's GPUs, largest block first.
    replicas: dict[str, list[tuple[int, ...]]] = {}
    for li, lane in enumerate(wf.lanes):
        bins = {n: sorted(ids) for n, ids in lane_gpus[li].items()}
        for phase in lane:
            room = {n: list(ids) for n, ids in bins.items()}
            kept = _kept(keep, phase, choice, room, gpn)
            order = sorted(
                range(len(phase)),
                key=lambda i: (-granule(choice[phase[i]].tp, choice[phase[i]].pp, gpn), i),
            )
            for i in order:
                name = phase[i]
                c = choice[name]
                size = granule(c.tp, c.pp, gpn)
                have = kept.get(name, [])
                group = [(r, blk) for r in range(len(have), c.dp)
                         for blk in range(c.replica_size // size)]
                spread = not wf.by_name(name).trainable or c.num_gpus > gpn
                parts: dict[int, list[int]] = {}
                failed = _take(group, size, spread, room, parts)
                if failed:
                    raise InfeasiblePlanError(f"placement: {name} {failed}")
                replicas[name] = have + [tuple(parts[r]) for r in range(len(have), c.dp)]
    stages = tuple(StagePlan.place(choice[n], tuple(replicas[n])) for n in wf.names)
    return ExecutionPlan(stages)


def placement_ok(gpn: int, plan: ExecutionPlan, pool: Sequence[int], wf: Workflow) -> bool:
    """True only where :func:`placement_errors` finds nothing (its rules on arrays: a search's
    plan at thousands of GPUs is checked in a fraction of the loop's time); False where some
    rule may be broken, which the loop then names."""
    if sorted(plan.names) != sorted(wf.names) or not pool:
        return False
    top = max(max(pool), max((g for sp in plan.stages for g in sp.gpus), default=0)) + 1
    in_pool = np.zeros(top, dtype=bool)
    in_pool[np.asarray(pool, dtype=np.int64)] = True
    masks: dict[str, np.ndarray] = {}
    for sp in plan.stages:
        size = sp.tp * sp.pp
        if len(sp.replicas) != sp.dp or any(len(rep) != size for rep in sp.replicas):
            return False
        a = np.asarray(sp.replicas, dtype=np.int64).reshape(sp.dp, size)
        m = np.zeros(top, dtype=bool)
        if a.size:
            flat = a.reshape(-1)
            if flat.min() < 0 or not in_pool[flat].all():
                return False
            m[flat] = True
            if int(m.sum()) != flat.size:  # a GPU twice: in a replica or across replicas
                return False
            nodes = a // gpn
            if size <= gpn:
                if (nodes.min(axis=1) != nodes.max(axis=1)).any():
                    return False
            else:
                groups = nodes.reshape(sp.dp, sp.pp, sp.tp)
                if (groups != groups[:, :, :1]).any():
                    return False
        masks[sp.name] = m
    names = list(masks)
    for i, x in enumerate(names):
        for y in names[i + 1 :]:
            if wf.concurrent(x, y) and (masks[x] & masks[y]).any():
                return False
    return True


def placement_errors(
    setup: Setup, plan: ExecutionPlan, pool: Sequence[int], workflow: Workflow | None = None
) -> list[str]:
    """Every broken placement rule of ``plan`` on ``pool`` (empty: the plan is valid)."""
    gpn = setup.cluster.gpus_per_node
    wf = workflow if workflow is not None else setup.job.workflow
    if placement_ok(gpn, plan, pool, wf):
        return []
    return placement_rule_errors(gpn, plan, pool, wf)


def placement_rule_errors(gpn: int, plan: ExecutionPlan, pool: Sequence[int], wf: Workflow
                    ) -> list[str]:
    """:func:`placement_errors` rule by rule, naming each broken one."""
    in_pool = set(pool)
    errors: list[str] = []
    if sorted(plan.names) != sorted(wf.names):
        errors.append(f"plan has model-stages {plan.names}, workflow {wf.names}")
    gpu_sets: dict[str, set[int]] = {}
    for sp in plan.stages:
        if len(sp.replicas) != sp.dp:
            errors.append(f"{sp.name}: {len(sp.replicas)} replicas, dp={sp.dp}")
        size = sp.tp * sp.pp
        placed: set[int] = set()
        count = 0
        for r, rep in enumerate(sp.replicas):
            before = len(placed)
            count += len(rep)
            placed.update(rep)
            # a replica with a repeated GPU adds fewer than len(rep) to ``placed``
            if len(rep) != size or (len(placed) - before != len(rep) and len(set(rep)) != len(rep)):
                errors.append(f"{sp.name} replica {r}: {rep} is not tp·pp distinct GPUs")
            if size <= gpn:
                if rep and min(rep) // gpn != max(rep) // gpn:
                    errors.append(f"{sp.name} replica {r}: fits a node but spans nodes")
                continue
            nodes = [g // gpn for g in rep]
            for pp_rank in range(sp.pp):
                group = nodes[pp_rank * sp.tp : (pp_rank + 1) * sp.tp]
                if group.count(group[0]) != len(group):
                    errors.append(f"{sp.name} replica {r} pp_rank {pp_rank}: TP group spans nodes")
        if not placed <= in_pool:
            errors.append(f"{sp.name}: GPUs {sorted(placed - in_pool)[:8]} not in the pool")
        if len(placed) != count:
            errors.append(f"{sp.name}: replicas share GPUs")
        gpu_sets[sp.name] = placed
    names = list(gpu_sets)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if wf.concurrent(a, b) and gpu_sets[a] & gpu_sets[b]:
                errors.append(f"{a} and {b} run concurrently on shared GPUs")
    return errors


def node_loss_survivors(setup: Setup, plan: ExecutionPlan) -> dict[str, bool]:
    """Per model-stage: does some replica survive the loss of any single node?"""
    gpn = setup.cluster.gpus_per_node
    out: dict[str, bool] = {}
    nodes = {g // gpn for sp in plan.stages for g in sp.gpus}
    for sp in plan.stages:
        out[sp.name] = all(
            any(all(g // gpn != n for g in rep) for rep in sp.replicas) for n in nodes
        )
    return out

