"""L̂_tran: the transition DAG's critical path (DESIGN.md §2.3 item 3).

A primitive takes its communicator setup (per communicator group, created concurrently inside one
primitive) plus the busiest GPU's transfer time: per GPU the larger of the bytes it sends and
receives, each transfer over the intra-node link when both GPUs share a node and over the
inter-node link otherwise; L̂_tran is the critical path of these. Building the units a primitive
makes (their process groups, models and optimizers) does not overlap across primitives: a new
process group is created by every rank of the job in the same order, so the builds add up
(``unit-build`` per primitive that makes units). A transition also has a fixed cost of its own
(the new plan's process groups, the ranks' agreement). Without a calibration: the preset's link bandwidths and set-up time, no build
or fixed cost (:func:`rates`); with one, the figures fitted from measured transitions
(``p2p-intra`` / ``p2p-inter`` efficiencies where measured, the ``comm-setup``, ``unit-build``
and ``transition`` fixed costs: :mod:`nereus.cost.fit`).

On a cluster of several hardware types every transfer takes its own pair's link class
(:class:`Links`): the intra-node link of its node's type, the inter-node link between nodes of
one vendor (the slower end's), and the host transport's link class between vendors
(``ClusterSpec.host_gbps``: NCCL and RCCL cannot talk to each other, so those pairs go through
pinned host buffers and gloo) — :func:`transfer_links` lists every transfer of a DAG with its
transport. The scalar :func:`rates` of such a cluster are the slowest of its classes (what the
batched DAG's vectorized costing uses: an upper bound).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nereus.cost.calibration import Calibration
from nereus.emu.primitives import Destroy, Extend, Merge, Primitive, Split, shard_bytes
from nereus.emu.regions import GROUPINGS, Flow, groupings_differ
from nereus.spec.hardware import ClusterSpec, GpuSpec, OpClass
from nereus.transition.dag import TransitionDag

# The fixed-cost events of a transition (:mod:`nereus.cost.fit`): one communicator group set up,
# the units one DAG primitive makes, one unit rebuilt from gathered state (no DAG), the change.
TRANSITION_EVENTS = ("comm-setup", "unit-build", "reload-unit", "transition")


@dataclass(frozen=True)
class TransitionRates:
    """What a transition's primitives cost on a cluster: link bandwidths (bytes/s), the fixed
    seconds of one primitive that makes units (communicator set-up + unit build), and of the
    transition itself."""

    gpus_per_node: int
    intra_bps: float
    inter_bps: float
    setup_s: float  # one communicator group
    build_s: float  # the units one primitive makes
    fixed_s: float  # once per transition
    reload_unit_s: float  # one unit rebuilt from gathered state (a change without a DAG)

    @property
    def primitive_s(self) -> float:
        """Fixed seconds of a Split / Merge / Extend on the critical path (its communicator
        group; the units' builds are added up apart: :func:`transition_cost_s`)."""
        return self.setup_s


def _type_bps(gpu: GpuSpec, calib: Calibration | None) -> tuple[float, float]:
    """(intra, inter) bytes/s of one type's links, calibrated where ``calib`` measured them."""
    intra, inter = gpu.intra_node_gbps * 1e9, gpu.inter_node_gbps * 1e9
    if calib is None:
        return intra, inter
    return (intra * calib.measured_efficiency(gpu, OpClass.P2P_INTRA, 1.0),
            inter * calib.measured_efficiency(gpu, OpClass.P2P_INTER, 1.0))


class Links:
    """Bytes/s of a transfer from one GPU to another: per link class on a mixed cluster (module
    docstring), intra- or inter-node on one type (as :func:`rates` gives them)."""

    def __init__(self, cluster: ClusterSpec, calib: Calibration | None = None) -> None:
        r = rates(cluster, calib)
        self.gpn = cluster.gpus_per_node
        self.intra, self.inter = r.intra_bps, r.inter_bps
        self.mixed = cluster.heterogeneous
        self._cluster = cluster
        self._by_type = {t.name: _type_bps(t, calib) for t in cluster.types}

    def bps(self, a: int, b: int) -> float:
        if not self.mixed:
            return self.intra if a // self.gpn == b // self.gpn else self.inter
        cl = self._cluster
        ta, tb = cl.gpu_of(a), cl.gpu_of(b)
        if a // self.gpn == b // self.gpn:
            return self._by_type[ta.name][0]
        if ta.plays != tb.plays:
            return cl.host_gbps * 1e9
        return min(self._by_type[ta.name][1], self._by_type[tb.name][1])

    def kinds(self, seq: list[int]) -> tuple[str, ...]:
        """The hardware types along ``seq`` (part of a primitive's shape on a mixed cluster)."""
        return tuple(self._cluster.type_name(g) for g in seq) if self.mixed else ()


def transport_of(cluster: ClusterSpec, a: int, b: int) -> str:
    """``device`` (NCCL / RCCL) or ``host`` (pinned buffers + gloo) between two GPUs: ``host``
    between vendors and for CPU ranks, as :func:`nereus.cluster.transport.pair_transport`
    decides for placed ranks."""
    ga, gb = cluster.gpu_of(a), cluster.gpu_of(b)
    return "host" if ga.plays != gb.plays or ga.vendor == "cpu" else "device"


def transfer_links(dag: TransitionDag, cluster: ClusterSpec, calib: Calibration | None = None
                   ) -> list[tuple[int, int, int, str, float]]:
    """Every transfer of ``dag``: (primitive index, source GPU, destination GPU, transport,
    bytes/s it is costed at)."""
    links = Links(cluster, calib)
    out = []
    for i, p in enumerate(dag.primitives):
        if isinstance(p, Destroy):
            continue
        for src, dst, _ in p.flows:
            out.append((i, src, dst, transport_of(cluster, src, dst), links.bps(src, dst)))
    return out


def rates(cluster: ClusterSpec, calib: Calibration | None = None) -> TransitionRates:
    """The cluster's transition rates, calibrated where ``calib`` measured them (a mixed
    cluster: the slowest link of each kind and the slowest set-up)."""
    if cluster.heterogeneous:
        types = cluster.types
        bps = [_type_bps(t, calib) for t in types]
        inter = min(b[1] for b in bps)
        if len({t.plays for t in types}) > 1:
            inter = min(inter, cluster.host_gbps * 1e9)
        if calib is None:
            setup_s = max(t.comm_setup_s for t in types)
            return TransitionRates(cluster.gpus_per_node, min(b[0] for b in bps), inter,
                                   setup_s, 0.0, 0.0, setup_s)
        return TransitionRates(
            cluster.gpus_per_node, min(b[0] for b in bps), inter,
            max(calib.fixed_s(t, "comm-setup") for t in types),
            max(calib.fixed_s(t, "unit-build") for t in types),
            max(calib.fixed_s(t, "transition") for t in types),
            max(calib.fixed_s(t, "reload-unit") for t in types))
    gpu = cluster.gpu
    intra, inter = gpu.intra_node_gbps * 1e9, gpu.inter_node_gbps * 1e9
    if calib is None:
        return TransitionRates(cluster.gpus_per_node, intra, inter, gpu.comm_setup_s, 0.0, 0.0,
                               gpu.comm_setup_s)
    return TransitionRates(
        cluster.gpus_per_node,
        intra * calib.measured_efficiency(gpu, OpClass.P2P_INTRA, 1.0),
        inter * calib.measured_efficiency(gpu, OpClass.P2P_INTER, 1.0),
        calib.fixed_s(gpu, "comm-setup"), calib.fixed_s(gpu, "unit-build"),
        calib.fixed_s(gpu, "transition"), calib.fixed_s(gpu, "reload-unit"))

# Shape of a Split or Merge: its layouts, grouping and bytes, with its GPUs renumbered in order of
# first appearance and each GPU's node renumbered likewise. Two primitives of one shape move the
# same bytes over the same kinds of link, so they take the same time.
Shape = tuple[object, ...]


def _busiest_s(flows: tuple[Flow, ...], bps: Callable[[int, int], float]) -> float:
    send: dict[int, float] = {}
    recv: dict[int, float] = {}
    for src, dst, nbytes in flows:
        s = nbytes / bps(src, dst)
        send[src] = send.get(src, 0.0) + s
        recv[dst] = recv.get(dst, 0.0) + s
    return max([*send.values(), *recv.values(), 0.0])


def _shape(p: Primitive, gpn: int, kinds: Callable[[list[int]], tuple[str, ...]]) -> Shape:
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
            tuple(nodes.setdefault(g // gpn, len(nodes)) for g in seq), kinds(seq))


def _duration_s(p: Primitive, links: Links, setup_s: float,
                cache: dict[Shape, float] | None) -> float:
    gpn, bps = links.gpn, links.bps
    if isinstance(p, Destroy):
        return p.comm_groups * setup_s  # local teardown: no transfers
    if isinstance(p, Extend):  # one shard per rank pair, all pairs at once
        sb = shard_bytes(p.state_bytes, p.src.layout, p.replicated_bytes)
        pairs = zip(p.src.gpus, p.new.gpus, strict=True)
        if links.mixed:
            return p.comm_groups * setup_s + max(sb / bps(a, b) for a, b in pairs)
        cross = any(a // gpn != b // gpn for a, b in pairs)
        return p.comm_groups * setup_s + sb / (links.inter if cross else links.intra)
    if isinstance(p, Split):
        lay, sub = p.src.layout, p.into[0].layout
        gpus = p.src.gpus
        if not p.replicated_bytes and min(gpus) // gpn == max(gpus) // gpn and (
                p.grouping == GROUPINGS[0] or not groupings_differ(lay, sub)):
            # one node, position-wise all-gather: every GPU sends its shard to the k-1 others
            # of its block and receives as many, whatever the arrangement of the sub-units
            k = lay.size // sub.size
            return setup_s + (k - 1) * round(p.state_bytes / lay.size) / bps(gpus[0], gpus[0])
    elif isinstance(p, Merge):
        gpus = p.into.gpus
        if min(gpus) // gpn == max(gpus) // gpn:  # one node: its (cached) flows directly
            return p.comm_groups * setup_s + _busiest_s(p.flows, bps)
    if cache is None:
        return p.comm_groups * setup_s + _busiest_s(p.flows, bps)
    key = _shape(p, gpn, links.kinds)
    got = cache.get(key)
    if got is None:
        got = cache[key] = p.comm_groups * setup_s + _busiest_s(p.flows, bps)
    return got


def primitive_duration_s(p: Primitive, cluster: ClusterSpec,
                         calib: Calibration | None = None) -> float:
    r = rates(cluster, calib)
    return _duration_s(p, Links(cluster, calib), r.primitive_s, None)


def durations_s(dag: TransitionDag, cluster: ClusterSpec,
                calib: Calibration | None = None) -> list[float]:
    """Per primitive; primitives of one shape are timed once. (A primitive's fixed cost is its
    communicator groups' set-up: one group for those that make units, which also build them —
    ``primitive_s`` — none for a Destroy.)"""
    r = rates(cluster, calib)
    links = Links(cluster, calib)
    cache: dict[Shape, float] = {}
    return [_duration_s(p, links, r.primitive_s, cache) for p in dag.primitives]


def critical_path_s(dag: TransitionDag, durations: list[float]) -> float:
    """Longest path through the DAG with node weights ``durations``."""
    preds = dag.preds
    finish = [0.0] * len(dag.primitives)
    for i in dag.order:  # a topological order
        pi = preds[i]
        finish[i] = (max([finish[j] for j in pi]) if pi else 0.0) + durations[i]
    return max(finish, default=0.0)


def transition_cost_s(dag: TransitionDag, cluster: ClusterSpec,
                      calib: Calibration | None = None) -> float:
    """L̂_tran in seconds: what admission weighs against the gain of the new plan."""
    r = rates(cluster, calib)
    builds = sum(not isinstance(p, Destroy) for p in dag.primitives)
    return r.fixed_s + r.build_s * builds + critical_path_s(dag, durations_s(dag, cluster, calib))


def critical_path(dag: TransitionDag, durations: list[float]) -> list[int]:
    """The primitives of one longest path through the DAG, in order."""
    preds = dag.preds
    finish = [0.0] * len(dag.primitives)
    via = [-1] * len(dag.primitives)
    for i in dag.order:
        pi = preds[i]
        if pi:
            j = max(pi, key=lambda k: finish[k])
            finish[i], via[i] = finish[j] + durations[i], j
        else:
            finish[i] = durations[i]
    if not finish:
        return []
    path = [max(range(len(finish)), key=lambda k: finish[k])]
    while via[path[-1]] >= 0:
        path.append(via[path[-1]])
    return path[::-1]


def path_features(dag: TransitionDag, cluster: ClusterSpec, calib: Calibration | None = None
                  ) -> tuple[dict[str, float], dict[str, float]]:
    """What L̂_tran is made of, for fitting it to a measured transition (:mod:`nereus.cost.fit`):
    (seconds of transfers at the links' nominal bandwidth per op class — ``p2p-intra`` /
    ``p2p-inter``, by whether the primitive's flows cross nodes — and ``comm-setup`` per
    primitive along the critical path under ``calib``; ``unit-build`` per primitive that makes
    units in the whole DAG; one ``transition``)."""
    nominal = Links(cluster, None)
    ideal = {OpClass.P2P_INTRA.value: 0.0, OpClass.P2P_INTER.value: 0.0}
    counts = {"comm-setup": 0.0, "transition": 1.0,
              "unit-build": float(sum(not isinstance(p, Destroy) for p in dag.primitives))}
    gpn = cluster.gpus_per_node
    for i in critical_path(dag, durations_s(dag, cluster, calib)):
        p = dag.primitives[i]
        if isinstance(p, Destroy):
            continue
        counts["comm-setup"] += p.comm_groups
        cross = any(a // gpn != b // gpn for a, b, _ in p.flows)
        transfer = _duration_s(p, nominal, 0.0, None)
        ideal[(OpClass.P2P_INTER if cross else OpClass.P2P_INTRA).value] += transfer
    return ideal, counts



def restart_features(cluster: ClusterSpec, state_bytes: int, units: int
                     ) -> tuple[dict[str, float], dict[str, float]]:
    """What a change without a DAG is made of (every changed model-stage's state gathered and
    reloaded in process): ``state_bytes`` twice over the inter-node link at its nominal
    bandwidth, one ``reload-unit`` per unit of the target plan (``units``: every unit is rebuilt
    from the gathered state, its model, optimizer and groups; no transfer group, no wave) and
    one ``transition`` — the features of :func:`restart_cost_s` and of the sample a measured one
    gives (:mod:`nereus.cost.fit`)."""
    ideal = {OpClass.P2P_INTER.value: 2.0 * state_bytes / rates(cluster, None).inter_bps}
    return ideal, {"reload-unit": float(units), "transition": 1.0}


def restart_cost_s(cluster: ClusterSpec, state_bytes: int, units: int,
                   calib: Calibration | None = None) -> float:
    """Seconds of a change without a DAG (:func:`restart_features`) at the transition rates
    ``calib`` measured (:func:`rates`; without one: the preset's link, a communicator set-up
    per unit)."""
    r = rates(cluster, calib)
    return 2.0 * state_bytes / r.inter_bps + units * r.reload_unit_s + r.fixed_s


def transition_sample(dag: TransitionDag | None, executor: str, state_bytes: int, units: int,
                      cluster: ClusterSpec, calib: Calibration | None, measured_s: float
                      ) -> tuple[dict[str, float], dict[str, float]] | None:
    """The features of a measured plan change, for a :class:`nereus.cost.fit.Sample` of the
    transition rates: its DAG's (:func:`path_features`) when ``executor`` ran one, those of
    a gather-and-reload of ``state_bytes`` into ``units`` units (:func:`restart_features`)
    otherwise; None where nothing is fitted (no time measured, or a host-staged change: its
    host legs are no feature of the fit). A DAG without primitives — a change of batch split
    only, which keeps every unit and group on the ranks — has the one ``transition`` event and
    nothing else, so its measured time calibrates exactly the fixed cost such a change is
    priced at (:func:`transition_cost_s`: ``fixed_s`` alone)."""
    if not measured_s > 0 or executor == "staged":
        return None
    if executor == "dag" and dag is not None:
        return path_features(dag, cluster, calib)
    return restart_features(cluster, state_bytes, units)

