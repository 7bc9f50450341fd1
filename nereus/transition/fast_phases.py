""":func:`phases.order_for_memory` on a batched DAG: the same "memory" edges and the same failed
GPUs, computed without building primitive records.

What the reference reads off records comes from the blocks here: a primitive's busiest bytes are
one number per block (a Split or Merge moves its template's bytes whatever its GPUs); the bytes a
model-stage holds on a GPU before, during and after each of its primitives come from per-GPU byte
changes (:func:`_incidences`); the longest byte paths through the DAG are computed a level at a
time. The greedy itself (:class:`_Search`, :func:`order_memory_edges`) is the reference's, on
plain tuples ``(bytes, after, until)``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import numpy as np

from nereus.transition.fast_blocks import (
    CONTIGUOUS,
    DESTROY,
    EXTEND,
    INTERLEAVED,
    MERGE,
    SPLIT,
    Block,
)
from nereus.transition.fast_cost import flow_template
from nereus.transition.fast_memory import _received
from nereus.transition.primitives import shard_bytes

Phase = tuple[int, int, int]  # (bytes, after, until): as phases.Phase


def priority_order(n: int, a: np.ndarray, b: np.ndarray, kind: np.ndarray) -> list[int]:
    """The heap order of :func:`compile._assemble` (key: kind, then index — primitive indices
    follow the model-stages' rank order)."""
    succ: list[list[int]] = [[] for _ in range(n)]
    for x, y in zip(a.tolist(), b.tolist(), strict=True):
        succ[x].append(y)
    indeg = np.bincount(b, minlength=n).tolist()
    keys = (kind.astype(np.int64) * n + np.arange(n)).tolist()
    heap = [keys[i] for i in range(n) if not indeg[i]]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        i = heapq.heappop(heap) % n
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if not indeg[j]:
                heapq.heappush(heap, keys[j])
    return order


def _busiest_bytes(blk: Block, state_bytes: int, rep: int) -> int:
    """``phases._busiest_bytes`` of every primitive of ``blk`` (one value per block)."""
    if blk.kind == DESTROY:
        return 0
    if blk.kind == EXTEND:
        return shard_bytes(state_bytes, blk.lay, rep)
    sub = blk.sub
    assert sub is not None and blk.grouping is not None
    best = 0
    for g in (INTERLEAVED, CONTIGUOUS):
        if (g == CONTIGUOUS and not blk.contiguous) or not np.count_nonzero(blk.grouping == g):
            continue
        fa, fb, nb = flow_template(blk.kind, blk.lay.tp, blk.lay.pp, sub.tp, sub.pp, g,
                                   state_bytes, rep)
        if nb.size:
            size = blk.lay.size
            best = max(best, int(np.bincount(fa, weights=nb, minlength=size).max()),
                       int(np.bincount(fb, weights=nb, minlength=size).max()))
    return best


def _longest(n: int, a: np.ndarray, b: np.ndarray, weight: np.ndarray, depth: int) -> np.ndarray:
    """Per node the heaviest path ending there, itself included (``depth`` rounds)."""
    out = weight.copy()
    start = np.empty(n, dtype=np.int64)
    for _ in range(depth):
        start.fill(0)
        np.maximum.at(start, b, out[a])
        np.add(start, weight, out=out)
    return out


def _incidences(blocks: Sequence[tuple[int, Block, int, int]], stage_of_block: Sequence[int],
                bad: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per (primitive, GPU of ``bad`` it keeps busy): primitive, GPU, model-stage number, and
    the bytes its inputs hold there, its peak there and the change it leaves there."""
    parts: list[tuple[np.ndarray, ...]] = []

    def add(i: np.ndarray, rows: np.ndarray, k: int, inputs: int | np.ndarray,
            peak: int | np.ndarray, delta: int | np.ndarray) -> None:
        sel = bad[rows]
        if not np.count_nonzero(sel):
            return
        shape = rows.shape
        parts.append((np.broadcast_to(i[:, None], shape)[sel], rows[sel],
                      np.full(int(np.count_nonzero(sel)), k, dtype=np.int64),
                      np.broadcast_to(inputs, shape)[sel], np.broadcast_to(peak, shape)[sel],
                      np.broadcast_to(delta, shape)[sel]))

    for (off, blk, sb, rep), k in zip(blocks, stage_of_block, strict=True):
        i = off + blk.start + np.arange(blk.rows.shape[0])
        own = shard_bytes(sb, blk.lay, rep)
        if blk.kind == DESTROY:
            add(i, blk.rows, k, own, own, -own)
        elif blk.kind == EXTEND:
            assert blk.new is not None
            add(i, blk.rows, k, own, 2 * own, 0)
            add(i, blk.new, k, 0, own, own)
        elif blk.kind == SPLIT:
            assert blk.sub is not None
            part = shard_bytes(sb, blk.sub, rep)
            add(i, blk.rows, k, own, own + part, part - own)
        else:
            assert blk.sub is not None and blk.grouping is not None
            assert blk.kind == MERGE
            part = shard_bytes(sb, blk.sub, rep)
            recv = np.empty(blk.rows.shape, dtype=np.int64)
            for g in (INTERLEAVED, CONTIGUOUS):
                sel = blk.grouping == g
                if np.count_nonzero(sel):
                    recv[sel] = _received(blk.lay.tp, blk.lay.pp, blk.sub.tp, blk.sub.pp, g,
                                          sb, rep)
            add(i, blk.rows, k, part, part + recv, own - part)
    if not parts:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z, z, z, z
    return tuple(np.concatenate([p[c] for p in parts]) for c in range(6))


def gpu_phases(
    n: int,
    order: Sequence[int],
    blocks: Sequence[tuple[int, Block, int, int]],
    stage_of_block: Sequence[int],
    held: Sequence[tuple[int, np.ndarray, int]],
    bad_gpus: Sequence[int],
    size: int,
) -> dict[int, dict[int, list[Phase]]]:
    """:func:`phases.gpu_phases` for the GPUs ``bad_gpus``: per GPU and model-stage number its
    phases. ``held``: (model-stage number, rows, bytes per position) of the source units."""
    bad = np.zeros(size, dtype=bool)
    bad[list(bad_gpus)] = True
    prim, gpu, stage, inputs, peak, delta = _incidences(blocks, stage_of_block, bad)
    pos = np.empty(n, dtype=np.int64)
    pos[np.array(order, dtype=np.int64)] = np.arange(n)
    # bytes held at the start: source units on the bad GPUs
    start: dict[tuple[int, int], int] = {}
    for k, rows, nbytes in held:
        sel = bad[rows]
        for g in rows[sel].tolist():
            start[(g, k)] = start.get((g, k), 0) + nbytes
    perm = np.lexsort((pos[prim], stage, gpu))
    out: dict[int, dict[int, list[Phase]]] = {g: {} for g in bad_gpus}
    rows_ = zip(prim[perm].tolist(), gpu[perm].tolist(), stage[perm].tolist(),
                inputs[perm].tolist(), peak[perm].tolist(), delta[perm].tolist(), strict=True)
    cur: tuple[int, int] | None = None
    seq: list[Phase] = []
    now = last = 0
    for i, g, k, inp, pk, dl in rows_:
        if (g, k) != cur:
            if cur is not None:
                seq.append((now, last, -1))
            cur = (g, k)
            now = start.pop(cur, 0)
            last = -1
            seq = out[g].setdefault(k, [])
        seq.append((now, last, i))
        seq.append((now - inp + pk, i, i))
        last = i
        now += dl
    if cur is not None:
        seq.append((now, last, -1))
    for (g, k), nbytes in start.items():  # held throughout, no primitive there
        out[g].setdefault(k, []).append((nbytes, -1, -1))
    return out


def _merged(seq: list[Phase]) -> list[Phase]:
    out: list[Phase] = []
    for ph in seq:
        if out and out[-1][0] == ph[0]:
            out[-1] = (ph[0], out[-1][1], ph[2])
        else:
            out.append(ph)
    return out


class _Search:
    """:class:`phases.PhaseSearch` on tuples (model-stages keyed by name order)."""

    def __init__(self, by_stage: dict[int, list[Phase]], names: Sequence[str], anc: list[int],
                 bit: list[int], limit: int,
                 memo: dict[tuple[object, ...], tuple[int, list[int]]]):
        self.anc, self.limit, self.memo = anc, limit, memo
        keys = sorted(by_stage, key=lambda k: names[k])
        flat: list[tuple[int, Phase]] = []
        for k, key in enumerate(keys):
            flat += [(k, ph) for ph in _merged(by_stage[key]) if ph[0] > 0]
        if flat:
            top: dict[int, int] = {}
            for k, ph in flat:
                if ph[0] > top.get(k, 0):
                    top[k] = ph[0]
            everything = sum(top.values())
            flat = [(k, ph) for k, ph in flat if ph[0] + everything - top[k] > limit]
        self.keys = keys
        self.flat = flat
        ends = self.ends = [bit[ph[2]] if ph[2] >= 0 else 0 for _, ph in flat]
        starts = self.starts = [anc[ph[1]] if ph[1] >= 0 else 0 for _, ph in flat]
        ok = self.ok = [0] * len(flat)
        for i in range(len(flat)):  # each pair once (the relation is symmetric)
            ki, end_i, start_i = flat[i][0], ends[i], starts[i]
            for j in range(i + 1, len(flat)):
                if flat[j][0] != ki and not (starts[j] & end_i or start_i & ends[j]):
                    ok[i] |= 1 << j
                    ok[j] |= 1 << i
        per_stage: list[list[int]] = [[] for _ in keys]
        for i, (k, _) in enumerate(flat):
            per_stage[k].append(i)
        for idx in per_stage:
            idx.sort(key=lambda i: -flat[i][1][0])
        self.stages = [idx for idx in per_stage if idx]

    def refresh(self, changed: set[int]) -> None:
        """The ancestors of the primitives ``changed`` grew. Sets only grow, so a pair only
        turns incompatible: for each phase beginning at a changed primitive, re-test its
        compatible partners on the term that grew (its start holding their end)."""
        flat, ends, starts, ok, anc = self.flat, self.ends, self.starts, self.ok, self.anc
        for i, (_, ph) in enumerate(flat):
            if ph[1] in changed:
                start = starts[i] = anc[ph[1]]
                row = ok[i]
                left = row
                while left:
                    low = left & -left
                    j = low.bit_length() - 1
                    left ^= low
                    if start & ends[j]:
                        row ^= low
                        ok[j] &= ~(1 << i)
                ok[i] = row

    def worst(self) -> tuple[int, list[Phase]]:
        """The search of :meth:`phases.PhaseSearch.worst`; its result depends on the limit, the
        phases' model-stages and bytes and the compatibility masks only, so GPUs with the same
        ones share it (``memo``)."""
        key = (self.limit, tuple((k, ph[0]) for k, ph in self.flat), tuple(self.ok))
        got = self.memo.get(key)
        if got is None:
            got = self.memo[key] = self._worst()
        return got[0], [self.flat[i][1] for i in got[1]]

    def _worst(self) -> tuple[int, list[int]]:
        flat, ok, stages, limit = self.flat, self.ok, self.stages, self.limit
        best_bytes = 0
        best: list[int] = []
        floor = limit

        def bound(k: int, allowed: int) -> int:
            total = 0
            for idx in stages[k:]:
                for i in idx:
                    if (allowed >> i) & 1:
                        total += flat[i][1][0]
                        break
            return total

        def visit(k: int, chosen: list[int], allowed: int, total: int) -> bool:
            nonlocal best_bytes, best
            if total + bound(k, allowed) <= max(best_bytes, floor):
                return False
            if k == len(stages):
                best_bytes, best = total, list(chosen)
                return total > limit
            for i in stages[k]:
                if (allowed >> i) & 1:
                    chosen.append(i)
                    stop = visit(k + 1, chosen, allowed & ok[i], total + flat[i][1][0])
                    chosen.pop()
                    if stop:
                        return True
            return visit(k + 1, chosen, allowed, total)

        visit(0, [], (1 << len(flat)) - 1, 0)
        return best_bytes, best


def order_memory_edges(
    n: int,
    a: np.ndarray,
    b: np.ndarray,
    depth: int,
    order: Sequence[int],
    weight: np.ndarray,
    phases: dict[int, dict[int, list[Phase]]],
    names: Sequence[str],
    limit_bytes: Callable[[int], int],
    max_edges_per_gpu: int = 64,
) -> tuple[list[tuple[int, int, str]], list[int]]:
    """:func:`phases.order_for_memory` given the DAG's edges ``a → b`` (its depth), its priority
    ``order``, each primitive's busiest bytes and the phases on the GPUs to order.

    Ancestor sets hold only the primitives a phase there can end at (those on the GPUs to
    order): the searches test no other bit, and a node whose set already holds an update's bits
    has descendants that hold them too, so the propagation stops where the reference's does or
    earlier with the same sets on those bits."""
    pos = [0] * n
    for k, i in enumerate(order):
        pos[i] = k
    succ: list[list[int]] = [[] for _ in range(n)]
    preds: list[list[int]] = [[] for _ in range(n)]
    for x, y in zip(a.tolist(), b.tolist(), strict=True):
        succ[x].append(y)
        preds[y].append(x)
    bit = [0] * n
    ends = sorted({ph[2] for by_stage in phases.values() for seq in by_stage.values()
                   for ph in seq if ph[2] >= 0})
    for r, i in enumerate(ends):
        bit[i] = 1 << r
    anc = [0] * n
    down = [0] * n  # anc[i] | its own bit
    for i in order:
        acc = 0
        for j in preds[i]:
            acc |= down[j]
        anc[i] = acc
        down[i] = acc | bit[i]
    head = _longest(n, a, b, weight, depth).tolist()
    tail = _longest(n, b, a, weight, depth).tolist()
    added: list[tuple[int, int, str]] = []
    failed: list[int] = []
    memo: dict[tuple[object, ...], tuple[int, list[int]]] = {}
    for g in sorted(phases):
        limit = limit_bytes(g)
        search = _Search(phases[g], names, anc, bit, limit, memo)
        for _ in range(max_edges_per_gpu):
            worst, witness = search.worst()
            if worst <= limit:
                break
            pairs = [(head[x[2]] + tail[y[1]], pos[y[1]] - pos[x[2]], x[2], y[1])
                     for ix, x in enumerate(witness) for iy, y in enumerate(witness)
                     if ix != iy and x[2] >= 0 and y[1] >= 0 and pos[x[2]] < pos[y[1]]]
            if not pairs:
                failed.append(g)
                break
            _, _, u, v = min(pairs)
            added.append((u, v, "memory"))
            succ[u].append(v)
            bits = anc[u] | bit[u]
            stack = [v]
            changed: set[int] = set()
            while stack:
                d = stack.pop()
                if anc[d] & bits != bits:
                    anc[d] |= bits
                    changed.add(d)
                    stack.extend(succ[d])
            search.refresh(changed)
        else:
            failed.append(g)
    return added, failed
