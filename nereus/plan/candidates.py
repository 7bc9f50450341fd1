"""Candidate layouts of one model-stage and their latency–GPU–memory frontier (DESIGN.md §3).

The plan space of a model-stage M on a pool of GPUs (``cluster.gpus_per_node`` per node):

- ``tp`` a power of two, ``tp ≤ gpus_per_node`` (TP inside a node), dividing both the attention
  heads and the KV heads of the model (Megatron's rule for query groups);
- ``pp`` a power of two that divides the number of layers evenly (every stage the same layers);
  a replica larger than a node (``tp·pp > gpus_per_node``) must fill whole nodes;
- ``dp ≥ 1`` with ``tp·pp·dp ≤ |pool|`` and ``dp`` dividing the sequences of M (per optimizer
  update for training, ``job.sequences_per_update``; per step otherwise, ``job.sequences``), so
  that an integer micro-batch ``b`` and accumulation ``a`` with ``dp·b·a = sequences`` exist;
- ``b`` from a small set: the powers of two dividing the per-replica sequences up to
  ``MICRO_BATCH_CAP[kind]``, plus the per-replica sequences themselves when under the cap;
- for training also full activation recomputation on and off.

Every candidate is costed once per (setup, calibration) on the whole cluster (``CostCache``;
memory first, latency only if it fits); candidates whose peak exceeds the capacity are dropped,
and of the rest only the Pareto frontier over (latency, GPUs, placement block, persistent bytes,
peak bytes) is kept: a candidate is dominated when another is no slower, needs no more GPUs in
no larger blocks, and holds no more persistent and no more peak bytes per GPU. The memory terms
are needed because model-stages of serial phases share GPUs (their persistent state adds up), so
a slower, smaller candidate can be the only one that fits; the block term because a pool with
partly failed nodes has room for small blocks only. For any pool, the frontier candidates that
fit it contain a dominator of every feasible candidate, so the DP stays exact.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

from nereus.cost.calibration import Calibration
from nereus.cost.latency import StageLatency, stage_latency
from nereus.cost.memory import MemoryBreakdown, memory_capacity_bytes, rank_memory, stage_memory
from nereus.cost.workload import workload
from nereus.spec.job import Setup
from nereus.spec.plan import Candidate
from nereus.spec.workflow import ModelStage

# Largest micro-batch (sequences per replica at once) tried per model-stage kind.
MICRO_BATCH_CAP: dict[str, int] = {"generate": 512, "forward": 32, "train": 16}


@dataclass(frozen=True)
class Costed:
    """One candidate with its cost: latency and per-GPU memory."""

    cand: Candidate
    latency: StageLatency
    memory: MemoryBreakdown
    latency_s: float
    persistent_bytes: int
    peak_bytes: int
    block: int  # GPUs of one placement block (``granule``)
    num_gpus: int  # tp·pp·dp

    @property
    def key(self) -> tuple[int, int, int, int, int, bool]:
        """A total order on candidates for deterministic tie-breaking."""
        c = self.cand
        return (c.tp, c.pp, c.dp, c.micro_batch, c.grad_accum, c.recompute)


def powers_of_two(limit: int) -> tuple[int, ...]:
    out: list[int] = []
    p = 1
    while p <= limit:
        out.append(p)
        p *= 2
    return tuple(out)


def node_counts(pool: Sequence[int], gpus_per_node: int) -> tuple[tuple[int, int], ...]:
    """``(node, available GPUs)`` of every node that has any GPU of ``pool``, by node id."""
    counts: dict[int, int] = {}
    for g in pool:
        counts[g // gpus_per_node] = counts.get(g // gpus_per_node, 0) + 1
    return tuple(sorted(counts.items()))


def level_capacity(counts: Sequence[int], level: int) -> int:
    """GPUs usable by TP groups of size ≥ ``level`` (powers of two): Σ_n level·⌊a_n/level⌋."""
    return sum(level * (a // level) for a in counts)


def pool_levels(pool: Sequence[int], gpus_per_node: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The block-size levels that constrain placement on ``pool`` and their GPU capacities.

    Placement blocks (``granule``: power-of-two sizes) fit into nodes with ``a_n`` free GPUs iff
    for every level s the GPUs of blocks of size ≥ s are at most Σ_n s·⌊a_n/s⌋ (divisible sizes:
    largest-first placement into any node with room never fails then). Level 1 is the plain GPU count; a level whose capacity equals it
    is implied and left out.
    """
    counts = [a for _, a in node_counts(pool, gpus_per_node)]
    total = len(pool)
    levels = [1]
    caps = [total]
    for s in powers_of_two(gpus_per_node)[1:]:
        cap = level_capacity(counts, s)
        if cap < total:
            levels.append(s)
            caps.append(cap)
    return tuple(levels), tuple(caps)


def granule(tp: int, pp: int, gpus_per_node: int) -> int:
    """GPUs of one placement block: a whole replica inside one node, or whole nodes.

    The latency model assumes a replica sits on consecutive GPUs from a node boundary, so a
    replica of ``tp·pp ≤ gpus_per_node`` GPUs goes into one node and a larger one onto whole nodes.
    """
    return min(tp * pp, gpus_per_node)


def demand_of(block: int, num_gpus: int, levels: Sequence[int]) -> tuple[int, ...]:
    """GPUs needed at each level: all of them at levels up to the block size, none above."""
    return tuple(num_gpus if block >= s else 0 for s in levels)


def stage_sequences(setup: Setup, ms: ModelStage) -> int:
    """Sequences ``dp·b·a`` must cover: per optimizer update (training) or per step."""
    if ms.trainable:
        return setup.job.sequences_per_update(ms.sequences_per_prompt)
    return setup.job.sequences(ms.sequences_per_prompt)


def micro_batches(per_replica: int, kind: str) -> tuple[int, ...]:
    cap = MICRO_BATCH_CAP.get(kind, 16)
    bs = [b for b in powers_of_two(min(per_replica, cap)) if per_replica % b == 0]
    if per_replica <= cap and per_replica not in bs:
        bs.append(per_replica)
    return tuple(bs)


def layouts_of(setup: Setup, ms: ModelStage, pool_size: int) -> tuple[tuple[int, int], ...]:
    """``(tp, pp)`` pairs of the plan space that fit ``pool_size`` GPUs."""
    model = setup.job.model(ms.role)
    gpn = setup.cluster.gpus_per_node
    out: list[tuple[int, int]] = []
    for tp in powers_of_two(gpn):
        if model.num_attention_heads % tp or model.num_kv_heads % tp:
            continue
        for pp in powers_of_two(model.num_layers):
            if model.num_layers % pp or tp * pp > pool_size:
                continue
            if tp * pp > gpn and (tp * pp) % gpn:
                continue  # a replica larger than a node must fill whole nodes
            out.append((tp, pp))
    return tuple(out)


def enumerate_candidates(setup: Setup, ms: ModelStage, pool_size: int) -> tuple[Candidate, ...]:
    """Every candidate of ``ms`` in the plan space on ``pool_size`` GPUs (module docstring)."""
    seqs = stage_sequences(setup, ms)
    out: list[Candidate] = []
    if seqs <= 0:
        return ()
    for tp, pp in layouts_of(setup, ms, pool_size):
        max_dp = pool_size // (tp * pp)
        for dp in range(1, min(max_dp, seqs) + 1):
            if seqs % dp:
                continue
            per_replica = seqs // dp
            for b in micro_batches(per_replica, ms.kind):
                for rc in (False, True) if ms.trainable else (False,):
                    out.append(Candidate(ms.name, tp, pp, dp, b, per_replica // b, rc))
    return tuple(out)


@dataclass(frozen=True)
class StageTable:
    """The costed plan space of one model-stage on the whole cluster.

    ``front`` is the Pareto frontier over (latency, GPUs, block size, persistent, peak): for any
    pool, its candidates that fit the pool contain a dominator of every feasible candidate.
    """

    name: str
    feasible: tuple[Costed, ...]  # candidates within capacity, by key
    front: tuple[Costed, ...]  # by (latency, ...)
    sizes: tuple[int, ...]  # GPUs of every enumerated candidate, sorted
    peaks: tuple[tuple[int, int], ...]  # (GPUs, peak bytes) of every enumerated candidate
    # Pool-independent views of ``front`` for pools of whole nodes (the GPU count is the only ``(latency, (GPUs,), persistent, peak, (front index,))`` by
    # GPUs, and the fastest latency per GPU count.
    # constraint there): DP points ``(latency, (GPUs,), persistent, peak, (front index,))`` in
    # front order (by latency), the sorted GPU counts, and the fastest latency per GPU count.
    points: tuple[tuple[float, tuple[int, ...], int, int, tuple[int, ...]], ...] = field(
        init=False, repr=False, compare=False
    )
    gpu_counts: tuple[int, ...] = field(init=False, repr=False, compare=False)
    fastest: tuple[tuple[int, float], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        pts = tuple(
            (c.latency_s, (c.num_gpus,), c.persistent_bytes, c.peak_bytes, (i,))
            for i, c in enumerate(self.front)
        )
        fastest: dict[int, float] = {}
        for p in pts:
            g = p[1][0]
            fastest[g] = min(fastest.get(g, p[0]), p[0])
        object.__setattr__(self, "points", pts)
        object.__setattr__(self, "gpu_counts", tuple(sorted(c.num_gpus for c in self.front)))
        object.__setattr__(self, "fastest", tuple(sorted(fastest.items())))

    def enumerated(self, pool_size: int) -> int:
        return bisect_right(self.sizes, pool_size)

    def min_peak_bytes(self, pool_size: int) -> int:
        return min((pk for g, pk in self.peaks if g <= pool_size), default=-1)


class CostCache:
    """Costed plan spaces under one (setup, calibration), each candidate evaluated once.

    A controller keeps one across replans: a change of the GPU pool reuses every evaluation, a
    new setup (lengths) or calibration (efficiencies, memory factors) starts afresh.
    """

    def __init__(self) -> None:
        self._key: tuple[Setup, Calibration] | None = None
        self._tables: dict[str, StageTable] = {}

    def table(self, setup: Setup, ms: ModelStage, calib: Calibration) -> StageTable:
        if self._key is None or self._key[0] != setup or self._key[1] != calib:
            self._key = (setup, calib)
            self._tables = {}
        got = self._tables.get(ms.name)
        if got is None:
            got = build_table(setup, ms, calib)
            self._tables[ms.name] = got
        return got

    def pinned(
        self, setup: Setup, ms: ModelStage, calib: Calibration, layout: tuple[int, int]
    ) -> StageTable:
        """The table of ``ms`` restricted to one (tp, pp) layout, with its own frontier."""
        key = f"{ms.name}@{layout[0]}x{layout[1]}"
        got = self._tables.get(key)
        if got is None:
            full = self.table(setup, ms, calib)
            feasible = tuple(c for c in full.feasible if (c.cand.tp, c.cand.pp) == layout)
            got = StageTable(ms.name, feasible, frontier(feasible), full.sizes, full.peaks)
            self._tables[key] = got
        return got


def _max_persistent_bytes(setup: Setup, ms: ModelStage, c: Candidate, calib: Calibration) -> int:
    """Largest persistent bytes over the pipeline ranks (depends on tp and pp only)."""
    ranks = [st.pp_rank for st, _ in workload(setup, ms, c).distinct_stages()]
    return max(rank_memory(setup, ms, c, calib, r).persistent_bytes for r in ranks)


def build_table(setup: Setup, ms: ModelStage, calib: Calibration) -> StageTable:
    """Cost every candidate of ``ms`` on the whole cluster: memory first, latency if it fits.

    ``persistent_bytes`` is the largest over the pipeline ranks and ``peak_bytes`` the peak of
    the most loaded rank (at least the persistent bytes), so both bound every GPU of a replica.
    """
    capacity = memory_capacity_bytes(setup)
    gpn = setup.cluster.gpus_per_node
    persistent: dict[tuple[int, int], int] = {}
    feasible: list[Costed] = []
    peaks: list[tuple[int, int]] = []
    for c in enumerate_candidates(setup, ms, setup.cluster.num_gpus):
        lay = (c.tp, c.pp)
        if lay not in persistent:
            persistent[lay] = _max_persistent_bytes(setup, ms, c, calib)
        mem = stage_memory(setup, ms, c, calib)
        peak = max(int(mem.peak_bytes), persistent[lay])
        peaks.append((c.num_gpus, peak))
        if peak > capacity:
            continue
        lat = stage_latency(setup, ms, c, calib)
        feasible.append(
            Costed(
                c, lat, mem, float(lat.total_s), persistent[lay], peak,
                granule(c.tp, c.pp, gpn), c.num_gpus,
            )
        )
    feasible.sort(key=lambda x: x.key)
    peaks.sort()
    return StageTable(
        ms.name, tuple(feasible), frontier(feasible), tuple(g for g, _ in peaks), tuple(peaks)
    )


def dominates(a: Costed, b: Costed) -> bool:
    """``a`` is no worse than ``b`` in every frontier criterion."""
    return (
        a.latency_s <= b.latency_s
        and a.persistent_bytes <= b.persistent_bytes
        and a.peak_bytes <= b.peak_bytes
        and a.num_gpus <= b.num_gpus
        and a.block <= b.block
    )


def frontier(costed: Sequence[Costed]) -> tuple[Costed, ...]:
    """Pareto frontier over (latency, GPUs, block, persistent, peak); ties keep the smallest key.

    Sorted by all criteria: a point can only be dominated by an earlier one.
    """
    order = sorted(
        costed,
        key=lambda c: (c.latency_s, c.num_gpus, c.block, c.persistent_bytes, c.peak_bytes, c.key),
    )
    kept: list[Costed] = []
    # Bucket kept points by (GPUs, block): few distinct pairs, so the check is short.
    buckets: dict[tuple[int, int], list[Costed]] = {}
    for c in order:
        dominated = False
        for (g, blk), pts in buckets.items():
            if g <= c.num_gpus and blk <= c.block:
                for k in pts:
                    if k.persistent_bytes <= c.persistent_bytes and k.peak_bytes <= c.peak_bytes:
                        dominated = True
                        break
                if dominated:
                    break
        if not dominated:
            kept.append(c)
            buckets.setdefault((c.num_gpus, c.block), []).append(c)
    return tuple(kept)
