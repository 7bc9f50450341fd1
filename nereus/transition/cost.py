"""L̂_tran: the transition DAG's critical path (DESIGN.md §2.3 item 3).

A primitive takes its communicator setup (``GpuSpec.comm_setup_s`` per communicator group, created
concurrently inside one primitive) plus the busiest GPU's transfer time: per GPU the larger of the
bytes it sends and receives, each transfer over the intra-node link when both GPUs share a node and
over the inter-node link otherwise.
"""

from __future__ import annotations

from nereus.spec.hardware import ClusterSpec
from nereus.transition.dag import TransitionDag
from nereus.transition.primitives import Primitive


def primitive_duration_s(p: Primitive, cluster: ClusterSpec) -> float:
    gpn = cluster.gpus_per_node
    intra = cluster.gpu.intra_node_gbps * 1e9
    inter = cluster.gpu.inter_node_gbps * 1e9
    send: dict[int, float] = {}
    recv: dict[int, float] = {}
    for src, dst, nbytes in p.flows:
        s = nbytes / (intra if src // gpn == dst // gpn else inter)
        send[src] = send.get(src, 0.0) + s
        recv[dst] = recv.get(dst, 0.0) + s
    busiest = max([*send.values(), *recv.values(), 0.0])
    return p.comm_groups * cluster.gpu.comm_setup_s + busiest


def durations_s(dag: TransitionDag, cluster: ClusterSpec) -> list[float]:
    return [primitive_duration_s(p, cluster) for p in dag.primitives]


def critical_path_s(dag: TransitionDag, durations: list[float]) -> float:
    """Longest path through the DAG with node weights ``durations``."""
    preds = dag.preds
    finish = [0.0] * len(dag.primitives)
    for i in dag.order:  # a topological order
        start = max((finish[j] for j in preds[i]), default=0.0)
        finish[i] = start + durations[i]
    return max(finish, default=0.0)


def transition_cost_s(dag: TransitionDag, cluster: ClusterSpec) -> float:
    """L̂_tran in seconds: what admission weighs against the gain of the new plan."""
    return critical_path_s(dag, durations_s(dag, cluster))
