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

from nereus.emu.unit import Emu
from nereus.transition.dag import TransitionDag
from nereus.transition.primitives import consumed, produced, read_only


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
    primitive i. Stops at the first sum above ``limit``."""
    stages = [(m, sorted((ph for ph in seq if ph.nbytes > 0), key=lambda ph: -ph.nbytes))
              for m, seq in sorted(by_stage.items())]
    stages = [(m, seq) for m, seq in stages if seq]
    tops = [seq[0].nbytes for _, seq in stages]
    rest = [sum(tops[k:]) for k in range(len(tops) + 1)]
    best_bytes = 0
    best: list[tuple[str, Phase]] = []

    def visit(k: int, chosen: list[tuple[str, Phase]], total: int) -> bool:
        nonlocal best_bytes, best
        if total + rest[k] <= best_bytes:
            return False
        if k == len(stages):
            best_bytes, best = total, list(chosen)
            return limit is not None and total > limit
        m, seq = stages[k]
        for ph in seq:
            if all(unordered(ph, other, anc) for _, other in chosen):
                chosen.append((m, ph))
                stop = visit(k + 1, chosen, total + ph.nbytes)
                chosen.pop()
                if stop:
                    return True
        return visit(k + 1, chosen, total)

    visit(0, [], 0)
    return best_bytes, best


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
        for _ in range(max_edges_per_gpu):
            worst, witness = worst_bytes(phases[g], anc, limit)
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
            while stack:
                d = stack.pop()
                if anc[d] & bits != bits:
                    anc[d] |= bits
                    stack.extend(succ[d])
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
