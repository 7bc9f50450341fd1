"""Candidate layouts of one model-stage and their latency–GPU–memory frontier (DESIGN.md §3).

The plan space of a model-stage M on a pool of GPUs (``cluster.gpus_per_node`` per node) and a
``job.space`` (``nereus.spec.job.PlanSpace``):

- ``tp`` a power of two, ``tp ≤ gpus_per_node`` (TP inside a node), dividing both the attention
  heads and the KV heads of the model (Megatron's rule for query groups);
- ``pp`` from :func:`pipeline_depths`: the divisors of the layer count (``"even"``), or every depth
  whose Megatron split (``nereus.spec.model.pipeline_split``) has a smaller largest stage than
  every shallower depth (``"uneven"``; the divisors are among them); a replica of at most a node
  (``tp·pp ≤ gpus_per_node``) has a power-of-two size (placement blocks stay divisible), a larger
  one fills whole nodes;
- ``dp ≥ 1`` with ``tp·pp·dp ≤ |pool|`` from :func:`dp_degrees`: the divisors of the sequences of
  M (per optimizer update for training, ``job.sequences_per_update``; per step otherwise), or
  with ``uneven_dp`` the smallest degree of each largest share ``⌈n/dp⌉``;
- ``b`` from a small set: the powers of two dividing the largest share up to
  ``MICRO_BATCH_CAP[kind]``, plus the share itself when under the cap; ``b·a`` = the share.
  Generation in the uneven space also takes every power of two below the share: decode runs
  ``b`` sequences at once (the concurrency the KV cache allows), ``a = ⌈share/b⌉`` rounds, the
  last one partial (costed as a full round);
- for training also full activation recomputation on and off.

Every candidate is costed once per (setup, calibration) on the whole cluster (``CostCache``),
vectorized over the candidates (``nereus.cost.latency.latency_arrays``,
``nereus.cost.memory.stage_arrays``); the enumeration itself depends on neither lengths nor
calibration and is kept across them. Candidates whose peak exceeds the capacity are dropped, and
of the rest only the Pareto frontier over (latency, GPUs, placement block, persistent bytes, peak
bytes) is kept: a candidate is dominated when another is no slower, needs no more GPUs in no
larger blocks, and holds no more persistent and no more peak bytes per GPU. The memory terms are
needed because model-stages of serial phases share GPUs (their persistent state adds up), so a
slower, smaller candidate can be the only one that fits; the block term because a pool with
partly failed nodes has room for small blocks only. For any pool, the frontier candidates that
fit it contain a dominator of every feasible candidate, so the DP stays exact.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from nereus.cost.calibration import Calibration
from nereus.cost.latency import LatencyArrays, StageLatency, latency_arrays, rates
from nereus.cost.memory import (
    CPU_WORKSPACE_BYTES,
    WORKSPACE_BYTES,
    MemoryArrays,
    MemoryBreakdown,
    memory_capacity_bytes,
    stage_arrays,
)
from nereus.cost.workload import CandidateArrays, stage_context
from nereus.plan.frontier import dominates as dominates  # re-exported: the frontier's reference
from nereus.plan.frontier import frontier as frontier
from nereus.plan.frontier import frontier_indices
from nereus.spec.job import Setup
from nereus.spec.model import pipeline_split
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


def micro_batches(per_replica: int, kind: str, partial_rounds: bool = False) -> tuple[int, ...]:
    """Micro-batch sizes tried for a replica of ``per_replica`` sequences: powers of two that
    divide it, up to the kind's cap, and the whole share when under the cap. With
    ``partial_rounds`` (generation in the uneven space) every power of two up to the share: a
    round of ``b`` concurrently decoded sequences as the KV cache allows, the last one partial."""
    cap = MICRO_BATCH_CAP.get(kind, 16)
    bs = [b for b in powers_of_two(min(per_replica, cap))
          if partial_rounds or per_replica % b == 0]
    if per_replica <= cap and per_replica not in bs:
        bs.append(per_replica)
    return tuple(bs)


@functools.lru_cache(maxsize=256)
def pipeline_depths(num_layers: int, pipeline: str) -> tuple[int, ...]:
    """Pipeline depths of the plan space (module docstring), ascending."""
    if pipeline == "even":
        return tuple(p for p in range(1, num_layers + 1) if num_layers % p == 0)
    out: list[int] = []
    best = num_layers + 1
    for p in range(1, num_layers + 1):
        largest = max(pipeline_split(num_layers, p))
        if largest < best:
            out.append(p)
            best = largest
    return tuple(out)


@functools.lru_cache(maxsize=256)
def dp_degrees(sequences: int, max_dp: int, uneven: bool) -> tuple[int, ...]:
    """DP degrees up to ``max_dp`` (module docstring), ascending."""
    top = min(max_dp, sequences)
    if not uneven:
        return tuple(d for d in range(1, top + 1) if sequences % d == 0)
    out = {-(-sequences // -(-sequences // d)) for d in range(1, top + 1)}
    return tuple(sorted(out))


def layouts_of(setup: Setup, ms: ModelStage, pool_size: int) -> tuple[tuple[int, int], ...]:
    """``(tp, pp)`` pairs of the plan space that fit ``pool_size`` GPUs."""
    model = setup.job.model(ms.role)
    return _layouts(
        model.num_layers, model.num_attention_heads, model.num_kv_heads,
        setup.cluster.gpus_per_node, pool_size, setup.job.space.pipeline,
    )


@functools.lru_cache(maxsize=1024)
def _layouts(
    layers: int, heads: int, kv_heads: int, gpn: int, pool_size: int, pipeline: str
) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for tp in powers_of_two(gpn):
        if heads % tp or kv_heads % tp:
            continue
        for pp in pipeline_depths(layers, pipeline):
            size = tp * pp
            if size > pool_size:
                continue
            if size > gpn and (size % gpn or gpn & (gpn - 1)):
                continue  # a replica larger than a node fills whole (power-of-two) nodes
            if size <= gpn and size & (size - 1):
                continue  # a replica inside a node has a power-of-two size
            out.append((tp, pp))
    return tuple(out)


@dataclass(frozen=True, eq=False)
class Enumeration:
    """The plan space of one model-stage on a cluster, as arrays (independent of lengths and
    calibration): candidates, their GPU counts and placement blocks."""

    arrays: CandidateArrays
    num_gpus: np.ndarray
    block: np.ndarray
    sizes: np.ndarray  # GPUs of every candidate, sorted
    by_gpus: np.ndarray  # the order that sorts them


def enumeration(setup: Setup, ms: ModelStage, pool_size: int) -> Enumeration:
    """Every candidate of ``ms`` in the plan space on ``pool_size`` GPUs (cached)."""
    model = setup.job.model(ms.role)
    space = setup.job.space
    return _enumeration(
        model.num_layers, model.num_attention_heads, model.num_kv_heads, ms.kind, ms.trainable,
        stage_sequences(setup, ms), setup.cluster.gpus_per_node, pool_size, space.pipeline,
        space.uneven_dp,
    )


@functools.lru_cache(maxsize=256)
def _enumeration(
    layers: int, heads: int, kv_heads: int, kind: str, trainable: bool, seqs: int, gpn: int,
    pool_size: int, pipeline: str, uneven_dp: bool,
) -> Enumeration:
    rows: list[tuple[int, int, int, int, int, int]] = []
    rcs = (0, 1) if trainable else (0,)
    partial_rounds = kind == "generate" and uneven_dp
    if seqs > 0:
        for tp, pp in _layouts(layers, heads, kv_heads, gpn, pool_size, pipeline):
            for dp in dp_degrees(seqs, pool_size // (tp * pp), uneven_dp):
                share = -(-seqs // dp)
                for b in micro_batches(share, kind, partial_rounds):
                    for rc in rcs:
                        rows.append((tp, pp, dp, b, -(-share // b), rc))
    table = np.array(rows, dtype=np.int64).reshape(-1, 6)
    arrays = CandidateArrays(
        table[:, 0].copy(), table[:, 1].copy(), table[:, 2].copy(), table[:, 3].copy(),
        table[:, 4].copy(), table[:, 5].astype(bool),
    )
    size = arrays.tp * arrays.pp
    num_gpus = size * arrays.dp
    by_gpus = np.argsort(num_gpus, kind="stable")
    return Enumeration(arrays, num_gpus, np.minimum(size, gpn), num_gpus[by_gpus], by_gpus)


def enumerate_candidates(setup: Setup, ms: ModelStage, pool_size: int) -> tuple[Candidate, ...]:
    """Every candidate of ``ms`` in the plan space on ``pool_size`` GPUs (module docstring)."""
    arrays = enumeration(setup, ms, pool_size).arrays
    return tuple(arrays.candidate(ms.name, i) for i in range(len(arrays)))


class FrontRecords(Sequence["Costed"]):
    """The frontier of a table as ``Costed`` records, each built when first read."""

    def __init__(self, rows: _Rows) -> None:
        self._rows = rows
        self._made: list[Costed | None] = [None] * len(rows)

    def __len__(self) -> int:
        return len(self._made)

    @overload
    def __getitem__(self, i: int) -> Costed: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Costed]: ...

    def __getitem__(self, i: int | slice) -> Costed | Sequence[Costed]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        got = self._made[i]
        if got is None:
            got = self._rows.costed(i if i >= 0 else len(self) + i)
            self._made[i] = got
        return got


class StageTable:
    """The costed plan space of one model-stage on the whole cluster.

    The feasible candidates (within capacity) are kept as arrays; ``front`` is the Pareto
    frontier over (latency, GPUs, block size, persistent, peak), in frontier order (by latency):
    for any pool, its candidates that fit the pool contain a dominator of every feasible
    candidate. ``front_arrays`` holds its criteria as arrays; ``feasible`` materializes every
    feasible candidate (the exact references use it).
    """

    def __init__(
        self, name: str, rows: _Rows, sizes: np.ndarray, peaks: tuple[np.ndarray, np.ndarray]
    ) -> None:
        self.name = name
        self._rows = rows
        self._sizes = sizes
        self._peaks = peaks  # (GPUs, peak bytes) of every enumerated candidate, by GPUs
        self._feasible: tuple[Costed, ...] | None = None
        idx = frontier_indices(rows.latency.total_s, rows.num_gpus, rows.block, rows.persistent,
                               rows.peak)  # rows are in key order (enumeration order)
        front = rows.take(idx)
        self.front_rows = front
        self.front = FrontRecords(front)
        lat = front.latency.total_s.tolist()
        gpus = front.num_gpus.tolist()
        # Pool-independent views of ``front`` for pools of whole nodes (the GPU count is the
        # only constraint there): DP points ``(latency, (GPUs,), persistent, peak, (front
        # index,))`` in front order (by latency), the sorted GPU counts, and the fastest latency
        # per GPU count.
        self.points: tuple[tuple[float, tuple[int, ...], int, int, tuple[int, ...]], ...] = tuple(
            zip(lat, ((x,) for x in gpus), front.persistent.tolist(), front.peak.tolist(),
                ((i,) for i in range(len(lat))), strict=True)
        )
        fastest: dict[int, float] = {}
        for x, gx in zip(lat, gpus, strict=True):
            if gx not in fastest:  # front order is by latency: the first is the fastest
                fastest[gx] = x
        self.gpu_counts: tuple[int, ...] = tuple(sorted(gpus))
        self.fastest: tuple[tuple[int, float], ...] = tuple(sorted(fastest.items()))

    @property
    def feasible(self) -> tuple[Costed, ...]:
        """Every candidate within capacity, by key."""
        if self._feasible is None:
            got = [self._rows.costed(i) for i in range(len(self._rows))]
            got.sort(key=lambda x: x.key)
            self._feasible = tuple(got)
        return self._feasible

    @property
    def num_feasible(self) -> int:
        return len(self._rows)

    def enumerated(self, pool_size: int) -> int:
        return int(np.searchsorted(self._sizes, pool_size, side="right"))

    def min_peak_bytes(self, pool_size: int) -> int:
        g, pk = self._peaks
        k = int(np.searchsorted(g, pool_size, side="right"))
        return int(pk[:k].min()) if k else -1

    def fitting(self, levels: Sequence[int], caps: Sequence[int]) -> np.ndarray:
        """Indices (front order) of the frontier candidates that fit a pool's levels."""
        fr = self.front_rows
        ok = fr.num_gpus <= caps[0]
        for s, cap in zip(levels[1:], caps[1:], strict=True):
            ok &= ~((fr.block >= s) & (fr.num_gpus > cap))
        return np.flatnonzero(ok)

    def restricted(self, layout: tuple[int, ...]) -> StageTable:
        """The table restricted to one (tp, pp) layout — or (tp, pp, dp): also that DP degree —
        with its own frontier."""
        rows = self._rows
        match = (rows.arrays.tp == layout[0]) & (rows.arrays.pp == layout[1])
        if len(layout) > 2:
            match &= rows.arrays.dp == layout[2]
        keep = np.flatnonzero(match)
        return StageTable(self.name, rows.take(keep), self._sizes, self._peaks)


@dataclass(frozen=True, eq=False)
class _Rows:
    """Costed feasible candidates of one model-stage as arrays."""

    name: str
    arrays: CandidateArrays
    latency: LatencyArrays
    memory: MemoryArrays
    persistent: np.ndarray
    peak: np.ndarray
    block: np.ndarray
    num_gpus: np.ndarray

    def __len__(self) -> int:
        return len(self.arrays)

    def take(self, index: np.ndarray) -> _Rows:
        lat = self.latency
        mem = self.memory
        return _Rows(
            self.name, self.arrays.take(index),
            LatencyArrays(lat.keys, tuple(c[index] for c in lat.components), lat.total_s[index]),
            MemoryArrays(*(c[index] for c in mem._cols())),
            self.persistent[index], self.peak[index], self.block[index], self.num_gpus[index],
        )

    def costed(self, i: int) -> Costed:
        i = int(i)
        return Costed(
            self.arrays.candidate(self.name, i), self.latency.record(self.name, i),
            self.memory.record(i), float(self.latency.total_s[i]), int(self.persistent[i]),
            int(self.peak[i]), int(self.block[i]), int(self.num_gpus[i]),
        )


class CostCache:
    """Costed plan spaces under one (setup, calibration), each candidate evaluated once.

    A controller keeps one across replans: a change of the GPU pool reuses every evaluation, a
    new setup (lengths) or calibration (efficiencies, memory factors) re-costs the (cached)
    enumeration, vectorized.
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
        self, setup: Setup, ms: ModelStage, calib: Calibration, layout: tuple[int, ...]
    ) -> StageTable:
        """The table of ``ms`` restricted to one (tp, pp) or (tp, pp, dp) layout, with its own
        frontier."""
        key = f"{ms.name}@" + "x".join(str(v) for v in layout)
        full = self.table(setup, ms, calib)
        got = self._tables.get(key)
        if got is None:
            got = full.restricted(layout)
            self._tables[key] = got
        return got


def build_table(setup: Setup, ms: ModelStage, calib: Calibration) -> StageTable:
    """Cost every candidate of ``ms`` on the whole cluster (vectorized) and keep those within
    capacity.

    ``persistent_bytes`` is the largest over the pipeline ranks and ``peak_bytes`` the peak of
    the most loaded rank (at least the persistent bytes), so both bound every GPU of a replica.
    """
    enum = enumeration(setup, ms, setup.cluster.num_gpus)
    ctx = stage_context(setup, ms)
    capacity = memory_capacity_bytes(setup)
    ws = CPU_WORKSPACE_BYTES if setup.cluster.gpu.vendor == "cpu" else WORKSPACE_BYTES
    mem, persistent = stage_arrays(ctx, enum.arrays, ws, calib.memory_factor(ms.name))
    peak = np.maximum(mem.peak, persistent)
    peaks = (enum.num_gpus[enum.by_gpus], peak[enum.by_gpus])
    r = rates(setup.cluster.gpu, calib)
    lat = latency_arrays(ctx, r, setup.cluster.gpus_per_node, enum.arrays,
                         setup.cluster.contention)
    rows = _Rows(ms.name, enum.arrays, lat, mem, persistent, peak, enum.block, enum.num_gpus)
    fits = peak <= capacity
    if not fits.all():
        rows = rows.take(np.flatnonzero(fits))
    return StageTable(ms.name, rows, enum.sizes, peaks)
