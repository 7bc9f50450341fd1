"""The exact worst case of a GPU's bytes over every execution of a DAG, for co-resident stages.

Each model-stage's primitives on one GPU are ordered by the DAG, so its bytes there follow one
sequence of *phases*: before its first primitive, during each one (its buffers), between two, and
after the last. A phase lies between two events (a primitive's start or end). A set of phases of
different model-stages can all be active at one instant of some execution iff no pair is ordered,
i.e. no phase ends (at an event of primitive a) before another begins (at an event of primitive b)
with a an ancestor of b: the cut made of everything below the phases' beginnings then holds none of
their ends. So the largest sum over pairwise unordered phases is the most the GPU ever holds — the
bound of :mod:`residency` where that does not fit, since it assumes every phase may meet every
other.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from nereus.emu.primitives import consumed, produced, read_only
from nereus.emu.unit import Emu
from nereus.transition.dag import TransitionDag


@dataclass(frozen=True)
class Phase:
    """``nbytes`` held between the event ``after`` and the event ``until`` (primitive indices;
    -1: from the beginning / to the end)."""

    nbytes: int
    after: int
    until: int


def gpu_phases(
    dag: TransitionDag, gpus: Collection[int], unit_bytes: Callable[[Emu], int]
) -> dict[int, dict[str, list[Phase]]]:
    """Per GPU of ``gpus`` and model-stage its phases with bytes, from one run in ``dag.order``."""
    want = set(gpus)
    res: dict[tuple[int, str], int] = {}
    last: dict[tuple[int, str], int] = {}
    out: dict[int, dict[str, list[Phase]]] = {g: {} for g in want}

    def move(units: tuple[Emu, ...], sign: int) -> None:
        for u in units:
            b = sign * unit_bytes(u)
            for g in u.gpus:
                if g in want:
                    res[(g, u.model_stage)] = res.get((g, u.model_stage), 0) + b

    move(dag.source, 1)
    for i in dag.order:
        p = dag.primitives[i]
        m = p.model_stage
        here = [g for g in p.busy_gpus if g in want]
        if not here:
            continue
        ins = consumed(p) + read_only(p)
        peak = p.peak_bytes()
        for g in here:
            now = res.get((g, m), 0)
            seq = out[g].setdefault(m, [])
            seq.append(Phase(now, last.get((g, m), -1), i))
            inputs = sum(unit_bytes(u) for u in ins if g in u.gpus)
            seq.append(Phase(now - inputs + peak.get(g, 0), i, i))
            last[(g, m)] = i
        move(produced(p), 1)
        move(consumed(p), -1)
    for (g, m), b in res.items():
        out[g].setdefault(m, []).append(Phase(b, last.get((g, m), -1), -1))
    return out


def worst_bytes(by_stage: dict[str, list[Phase]], anc: list[int], limit: int | None = None
                ) -> tuple[int, list[tuple[str, Phase]]]:
    """The largest sum of pairwise unordered phases (one per model-stage at most) and the
    (model-stage, phase) pairs that make it; ``anc[i]`` is the bitset of the strict ancestors of
    primitive i. With ``limit``: the first sum above it, or at most ``limit`` when none is (the
    search then skips what cannot exceed it)."""
    return PhaseSearch(by_stage, anc, limit).worst()


class PhaseSearch:
    """:func:`worst_bytes` for one GPU, kept up to date as edges are added (:meth:`refresh`)."""

    def __init__(self, by_stage: dict[str, list[Phase]], anc: list[int], limit: int | None):
        self.anc, self.limit = anc, limit
        self.names = sorted(by_stage)
        flat: list[tuple[int, Phase]] = []  # (stage number, phase), stages in name order
        for k, m in enumerate(self.names):
            flat += [(k, ph) for ph in _merged(by_stage[m]) if ph.nbytes > 0]
        if limit is not None and flat:  # drop phases too small to take part in a sum above it
            top: dict[int, int] = {}
            for k, ph in flat:
                top[k] = max(top.get(k, 0), ph.nbytes)
            everything = sum(top.values())
            flat = [(k, ph) for k, ph in flat if ph.nbytes + everything - top[k] > limit]
        self.flat = flat
        self.ends = [1 << ph.until if ph.until >= 0 else 0 for _, ph in flat]  # ends at
        self.starts = [anc[ph.after] if ph.after >= 0 else 0 for _, ph in flat]  # begins after
        self.ok = [0] * len(flat)  # bit j of ok[i]: phases i and j may be active together
        for i in range(len(flat)):
            self._row(i)
        per_stage: list[list[int]] = [[] for _ in self.names]
        for i, (k, _) in enumerate(flat):
            per_stage[k].append(i)
        for idx in per_stage:
            idx.sort(key=lambda i: -flat[i][1].nbytes)
        self.stages = [idx for idx in per_stage if idx]

    def _row(self, i: int) -> None:
        flat, ends, starts, ok = self.flat, self.ends, self.starts, self.ok
        ki, end_i, start_i = flat[i][0], ends[i], starts[i]
        bit = 1 << i
        row = 0
        for j in range(len(flat)):
            if flat[j][0] != ki and not (starts[j] & end_i or start_i & ends[j]):
                row |= 1 << j
                ok[j] |= bit
            else:
                ok[j] &= ~bit
        ok[i] = row

    def refresh(self, changed: set[int]) -> None:
        """The ancestors of the primitives ``changed`` grew: update the phases they begin."""
        for i, (_, ph) in enumerate(self.flat):
            if ph.after in changed:
                self.starts[i] = self.anc[ph.after]
                self._row(i)

    def worst(self) -> tuple[int, list[tuple[str, Phase]]]:
        flat, ok, stages, limit = self.flat, self.ok, self.stages, self.limit
        best_bytes = 0
        best: list[int] = []
        floor = -1 if limit is None else limit  # a branch that cannot pass it is cut

        def bound(k: int, allowed: int) -> int:
            total = 0
            for idx in stages[k:]:
                for i in idx:
                    if (allowed >> i) & 1:
                        total += flat[i][1].nbytes
                        break
            return total

        def visit(k: int, chosen: list[int], allowed: int, total: int) -> bool:
            nonlocal best_bytes, best
            if total + bound(k, allowed) <= max(best_bytes, floor):
                return False
            if k == len(stages):
                best_bytes, best = total, list(chosen)
                return limit is not None and total > limit
            for i in stages[k]:
                if (allowed >> i) & 1:
                    chosen.append(i)
                    stop = visit(k + 1, chosen, allowed & ok[i], total + flat[i][1].nbytes)
                    chosen.pop()
                    if stop:
                        return True
            return visit(k + 1, chosen, allowed, total)

        visit(0, [], (1 << len(flat)) - 1, 0)
        return best_bytes, [(self.names[flat[i][0]], flat[i][1]) for i in best]


def _merged(seq: list[Phase]) -> list[Phase]:
    """Consecutive phases of equal bytes as one (the same interval of that many bytes)."""
    out: list[Phase] = []
    for ph in seq:
        if out and out[-1].nbytes == ph.nbytes:
            out[-1] = Phase(ph.nbytes, out[-1].after, ph.until)
        else:
            out.append(ph)
    return out


def before(x: Phase, y: Phase, anc: list[int]) -> bool:
    """True when ``x`` ends before ``y`` begins in every execution."""
    return x.until >= 0 and y.after >= 0 and bool((anc[y.after] >> x.until) & 1)


def unordered(x: Phase, y: Phase, anc: list[int]) -> bool:
    return not before(x, y, anc) and not before(y, x, anc)


def order_for_memory(
    dag: TransitionDag,
    gpus: list[int],
    limit_bytes: Callable[[int], int],
    max_edges_per_gpu: int = 64,
) -> tuple[tuple[tuple[int, int, str], ...], list[int]]:
    """"memory" edges that bring the worst case of each GPU of ``gpus`` within
    ``limit_bytes(gpu)``, and the GPUs where that failed (their caller orders every primitive).
    The compiler's fallback where the batches of :mod:`memory_order` do not fit.

    Greedy: while some unordered phases exceed the limit, order the pair of them whose edge
    makes the shortest path through it, measured in the bytes the busiest GPU of each primitive
    moves (an edge from earlier to later in ``dag.order`` keeps that order topological).
    """
    n = len(dag.primitives)
    pos = [0] * n
    for k, i in enumerate(dag.order):
        pos[i] = k
    succ: list[list[int]] = [[] for _ in range(n)]
    for a, b, _ in dag.edges:
        succ[a].append(b)
    anc = [0] * n
    preds = dag.preds
    for i in dag.order:
        acc = 0
        for j in preds[i]:
            acc |= anc[j] | (1 << j)
        anc[i] = acc
    weight = [_busiest_bytes(p.flows) for p in dag.primitives]
    head = [0] * n  # longest path ending at i, i included
    for i in dag.order:
        head[i] = max([head[j] for j in preds[i]], default=0) + weight[i]
    tail = [0] * n  # longest path starting at i, i included
    for i in reversed(dag.order):
        tail[i] = max([tail[j] for j in succ[i]], default=0) + weight[i]
    phases = gpu_phases(dag, gpus, dag.unit_bytes)
    added: list[tuple[int, int, str]] = []
    failed: list[int] = []
    for g in sorted(gpus):
        limit = limit_bytes(g)
        search = PhaseSearch(phases[g], anc, limit)
        for _ in range(max_edges_per_gpu):
            worst, witness = search.worst()
            if worst <= limit:
                break
            pairs = [(head[x.until] + tail[y.after], pos[y.after] - pos[x.until], x.until,
                      y.after)
                     for _, x in witness for _, y in witness
                     if x is not y and x.until >= 0 and y.after >= 0
                     and pos[x.until] < pos[y.after]]
            if not pairs:
                failed.append(g)
                break
            _, _, a, b = min(pairs)
            added.append((a, b, "memory"))
            succ[a].append(b)
            bits = anc[a] | (1 << a)
            stack = [b]
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
    return tuple(added), failed


def _busiest_bytes(flows: tuple[tuple[int, int, int], ...]) -> int:
    """The most bytes one GPU sends or receives in ``flows``."""
    load: dict[tuple[int, int], int] = {}
    for src, dst, nbytes in flows:
        load[(0, src)] = load.get((0, src), 0) + nbytes
        load[(1, dst)] = load.get((1, dst), 0) + nbytes
    return max(load.values(), default=0)
