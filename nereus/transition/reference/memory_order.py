"""Memory batches: on a GPU where co-resident model-stages could together exceed its capacity,
its primitives run in batches that fit, one batch after another (DESIGN.md §2.3, item 4).

Units of non-conflicting model-stages share GPUs (:mod:`residency`); during a transition their
buffers add up. Where the co-resident bound of a GPU exceeds what it can hold, the compiler takes
the primitives that keep that GPU busy in one topological order of the DAG shared by every such
GPU — by *level* (the most edges on a path ending at the primitive; ties by index) — and cuts
that sequence greedily into batches: a primitive joins the current batch while the bytes there
once the earlier batches have finished, plus what each primitive of the batch may add at most
(its transient buffers over its inputs, or what it leaves behind), stay within the limit.
"Memory" edges then run every primitive of a batch after every primitive of the batches since
the last one that holds a primitive that can add bytes; a primitive that can only free bytes (a
Destroy) waits for nobody. At any instant the GPU then holds at most the bound of the batch in
progress, whatever the execution. Every edge runs forward in the level order, so the batches of
all GPUs together keep the DAG acyclic; the priority order is recomputed over them.

Why levels and batches: a chain in priority order (every ready Destroy and Split of every
model-stage before any Extend) made primitives wait on work far down other model-stages' paths,
and ordering only the phases that can meet above capacity (:mod:`phases`, exact per GPU) is a
sequential search per GPU. On the benchmark's co-resident plans (Llama-3.1-8B PPO, 32-1,024 H200
GPUs) the batches give a 10-25% shorter critical path than the phase ordering (11-28% than the
priority-order chains), computed on arrays for all GPUs at once (:mod:`fast_memory_order`).
Where one primitive alone does not fit after the batches before it, the compiler falls back to
the phase ordering and, where that does not converge, to chains in priority order
(:func:`compile._chain_gpus`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from nereus.emu.primitives import consumed, produced, read_only
from nereus.emu.unit import Emu, Layout
from nereus.transition.dag import TransitionDag
from nereus.transition.graph import priority_order

UnitBytes = Callable[[str, Layout], int]


def levels_of(dag: TransitionDag) -> list[int]:
    """Per primitive the most edges on a path of ``dag`` ending at it."""
    lv = [0] * len(dag.primitives)
    preds = dag.preds
    for i in dag.order:
        for j in preds[i]:
            if lv[j] + 1 > lv[i]:
                lv[i] = lv[j] + 1
    return lv


def memory_batches(
    dag: TransitionDag,
    gpus: Sequence[int],
    unit_bytes: UnitBytes,
    limit_bytes: Callable[[int], int],
    key: Sequence[int],
) -> tuple[list[tuple[int, int]], tuple[int, int, int] | None]:
    """The "memory" edges (sorted, without repeats) that run the primitives keeping each GPU of
    ``gpus`` busy in batches, taken in ascending ``key`` (a topological order of ``dag``, one
    number per primitive) — see the module docstring; and ``None``, or ``(gpu, primitive,
    bytes)`` for the first primitive (GPUs in ascending order) that does not fit alone after
    the batches before it."""
    prims = dag.primitives
    seqs: dict[int, list[int]] = {g: [] for g in gpus}
    for i, p in enumerate(prims):
        for g in p.busy_gpus:
            if g in seqs:
                seqs[g].append(i)
    shard: dict[tuple[str, int, int], int] = {}

    def on(units: tuple[Emu, ...], g: int) -> int:
        total = 0
        for u in units:
            if g in u.gpus:
                k = (u.model_stage, u.layout.tp, u.layout.pp)
                b = shard.get(k)
                if b is None:
                    b = shard[k] = unit_bytes(u.model_stage, u.layout)
                total += b
        return total

    start: dict[int, int] = {}
    for u in dag.source:
        for g in u.gpus:
            if g in seqs:
                start[g] = start.get(g, 0) + unit_bytes(u.model_stage, u.layout)
    edges: set[tuple[int, int]] = set()
    for g in sorted(seqs):
        seq = sorted(seqs[g], key=key.__getitem__)
        now = start.get(g, 0)  # bytes once every earlier batch has finished
        limit = limit_bytes(g)
        prev: list[int] = []
        batch: list[int] = []
        waits: list[int] = []  # the batch's primitives that could add bytes
        grow = change = 0  # the batch's most added bytes, and what it leaves
        for i in seq:
            p = prims[i]
            left = on(produced(p), g) - on(consumed(p), g)
            up = max(0, left, p.peak_bytes()[g] - on(consumed(p) + read_only(p), g))
            if batch and now + grow + up > limit:
                edges.update((a, b) for a in prev for b in waits)
                prev = batch if waits else prev + batch
                batch, waits = [], []
                now += change
                grow = change = 0
            if now + up > limit:
                return sorted(edges), (g, i, now + up)
            batch.append(i)
            if up:
                waits.append(i)
            grow += up
            change += left
        edges.update((a, b) for a in prev for b in waits)
    return sorted(edges), None


def with_memory_edges(dag: TransitionDag, edges: Sequence[tuple[int, int]],
                      keys: Sequence[tuple[int, int, str, int]]) -> TransitionDag:
    """``dag`` with ``edges`` appended as "memory" edges and its priority order recomputed over
    all edges (``keys``: the priority keys of :func:`compile._assemble`): a chain by level may
    run against the old order."""
    all_edges = dag.edges + tuple((a, b, "memory") for a, b in edges)
    order = priority_order(len(dag.primitives), all_edges, keys)
    assert len(order) == len(dag.primitives), "memory chains follow one topological order"
    return replace(dag, edges=all_edges, order=tuple(order))
