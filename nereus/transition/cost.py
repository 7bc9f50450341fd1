"""L̂_tran: the transition DAG's critical path (DESIGN.md §2.3 item 3).

A primitive takes its communicator setup (``GpuSpec.comm_setup_s`` per communicator group, created
concurrently inside one primitive) plus the busiest GPU's transfer time: per GPU the larger of the
bytes it sends and receives, each transfer over the intra-node link when both GPUs share a node and
over the inter-node link otherwise.
"""

from __future__ import annotations

from nereus.emu.primitives import Destroy, Extend, Merge, Primitive, Split, shard_bytes
from nereus.emu.regions import GROUPINGS, Flow, groupings_differ
from nereus.spec.hardware import ClusterSpec
from nereus.transition.dag import TransitionDag

# Shape of a Split or Merge: its layouts, grouping and bytes, with its GPUs renumbered in order of
# first appearance and each GPU's node renumbered likewise. Two primitives of one shape move the
# same bytes over the same kinds of link, so they take the same time.
Shape = tuple[object, ...]


def _busiest_s(flows: tuple[Flow, ...], gpn: int, intra: float, inter: float) -> float:
    send: dict[int, float] = {}
    recv: dict[int, float] = {}
    for src, dst, nbytes in flows:
        s = nbytes / (intra if src // gpn == dst // gpn else inter)
        send[src] = send.get(src, 0.0) + s
        recv[dst] = recv.get(dst, 0.0) + s
    return max([*send.values(), *recv.values(), 0.0])


def _shape(p: Primitive, gpn: int) -> Shape:
    if isinstance(p, Merge):
        head: tuple[object, ...] = ("merge", p.srcs[0].layout.tp, p.srcs[0].layout.pp,
                                    p.into.layout.tp, p.into.layout.pp, p.grouping, p.state_bytes,
                                    p.replicated_bytes)
        seq = [*p.into.gpus, *(g for u in p.srcs for g in u.gpus)]
    else:
        assert not isinstance(p, (Destroy, Extend))
        sub = p.into[0].layout
        head = ("split", p.src.layout.tp, p.src.layout.pp, sub.tp, sub.pp, p.grouping,
                p.state_bytes, p.replicated_bytes)
        seq = [*p.src.gpus, *(g for u in p.into for g in u.gpus)]
    ids: dict[int, int] = {}
    nodes: dict[int, int] = {}
    return (*head, tuple(ids.setdefault(g, len(ids)) for g in seq),
            tuple(nodes.setdefault(g // gpn, len(nodes)) for g in seq))


def _duration_s(p: Primitive, gpn: int, intra: float, inter: float, setup_s: float,
                cache: dict[Shape, float] | None) -> float:
    if isinstance(p, Destroy):
        return p.comm_groups * setup_s  # local teardown: no transfers
    if isinstance(p, Extend):  # one shard per rank pair, all pairs at once
        sb = shard_bytes(p.state_bytes, p.src.layout, p.replicated_bytes)
        cross = any(a // gpn != b // gpn for a, b in zip(p.src.gpus, p.new.gpus, strict=True))
        return p.comm_groups * setup_s + sb / (inter if cross else intra)
    if isinstance(p, Split):
        lay, sub = p.src.layout, p.into[0].layout
        gpus = p.src.gpus
        if not p.replicated_bytes and min(gpus) // gpn == max(gpus) // gpn and (
                p.grouping == GROUPINGS[0] or not groupings_differ(lay, sub)):
            # one node, position-wise all-gather: every GPU sends its shard to the k-1 others
            # of its block and receives as many, whatever the arrangement of the sub-units
            k = lay.size // sub.size
            return setup_s + (k - 1) * round(p.state_bytes / lay.size) / intra
    elif isinstance(p, Merge):
        gpus = p.into.gpus
        if min(gpus) // gpn == max(gpus) // gpn:  # one node: its (cached) flows directly
            return p.comm_groups * setup_s + _busiest_s(p.flows, gpn, intra, inter)
    if cache is None:
        return p.comm_groups * setup_s + _busiest_s(p.flows, gpn, intra, inter)
    key = _shape(p, gpn)
    got = cache.get(key)
    if got is None:
        got = cache[key] = p.comm_groups * setup_s + _busiest_s(p.flows, gpn, intra, inter)
    return got


def primitive_duration_s(p: Primitive, cluster: ClusterSpec) -> float:
    gpu = cluster.gpu
    return _duration_s(p, cluster.gpus_per_node, gpu.intra_node_gbps * 1e9,
                       gpu.inter_node_gbps * 1e9, gpu.comm_setup_s, None)


def durations_s(dag: TransitionDag, cluster: ClusterSpec) -> list[float]:
    """Per primitive; primitives of one shape are timed once."""
    gpu = cluster.gpu
    gpn, intra, inter = cluster.gpus_per_node, gpu.intra_node_gbps * 1e9, gpu.inter_node_gbps * 1e9
    cache: dict[Shape, float] = {}
    return [_duration_s(p, gpn, intra, inter, gpu.comm_setup_s, cache) for p in dag.primitives]


def critical_path_s(dag: TransitionDag, durations: list[float]) -> float:
    """Longest path through the DAG with node weights ``durations``."""
    preds = dag.preds
    finish = [0.0] * len(dag.primitives)
    for i in dag.order:  # a topological order
        pi = preds[i]
        finish[i] = (max([finish[j] for j in pi]) if pi else 0.0) + durations[i]
    return max(finish, default=0.0)


def transition_cost_s(dag: TransitionDag, cluster: ClusterSpec) -> float:
    """L̂_tran in seconds: what admission weighs against the gain of the new plan."""
    return critical_path_s(dag, durations_s(dag, cluster))
