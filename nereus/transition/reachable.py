"""A proof that no transition exists: exhaustive search of a relaxation (pure).

Used where our compiler rejects a target, to decide whether the rejection is ours (a transition
exists that the compiler did not find) or the target's (none exists in any order, with any
primitives). The relaxation keeps only what every transition must respect when no two
model-stages may share a GPU (the default conflict relation):

- GPUs are *held*: a model-stage holds a GPU from the start of an Extend onto it (or from the
  beginning) to the end of the Destroy that frees it; two model-stages never hold one GPU;
- a model-stage keeps at least one whole copy of its state at every instant (DESIGN.md §2.2),
  so it always holds at least ``k`` GPUs, where ``k`` is the fewest GPUs whose capacity can
  hold the state at all (``ceil(state / capacity)``: some GPU of a copy on fewer would hold
  more than its capacity);
- at the end each model-stage holds exactly its target GPUs.

Every real transition is a sequence of such acquisitions and releases, so if the relaxation has
no sequence from the source to the target, no transition exists (layouts, Splits, Merges, memory
and timing only add constraints). The search is over counts per class of GPU (who holds it at
the start, who must at the end), which are interchangeable in the relaxation; it stops after
``max_states`` states without an answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from nereus.emu.unit import Emu


def min_gpus(state_bytes: int, capacity_bytes: int | None) -> int:
    """The fewest GPUs one whole copy of ``state_bytes`` can occupy (a lower bound)."""
    if not capacity_bytes or state_bytes <= 0:
        return 1
    return max(1, -(-state_bytes // capacity_bytes))


def reachable(
    source: Sequence[Emu],
    target: Sequence[Emu],
    pool: Iterable[int],
    min_held: Mapping[str, int],
    *,
    max_states: int = 200_000,
) -> bool | None:
    """True when the relaxation has a sequence from ``source`` to ``target`` on ``pool`` (the
    target may still be infeasible), False when it has none (no transition exists), None when
    the search stopped after ``max_states`` states. ``min_held``: per model-stage the fewest
    GPUs it must hold at every instant (:func:`min_gpus`; 1 when missing)."""
    names = sorted({u.model_stage for u in source} | {v.model_stage for v in target})
    idx = {m: k + 1 for k, m in enumerate(names)}  # 0: free
    src: dict[int, int] = {}
    tgt: dict[int, int] = {}
    for u in source:
        for g in u.gpus:
            src[g] = idx[u.model_stage]
    for v in target:
        for g in v.gpus:
            tgt[g] = idx[v.model_stage]
    gpus = set(pool) | set(src) | set(tgt)
    size: dict[tuple[int, int], int] = {}
    for g in gpus:
        key = (src.get(g, 0), tgt.get(g, 0))
        size[key] = size.get(key, 0) + 1
    classes = sorted(size)
    holders = len(names) + 1
    staying = {v.model_stage for v in target}  # a model-stage that leaves may free everything
    need = [0] + [max(1, int(min_held.get(m, 1))) if m in staying else 0 for m in names]

    def state_of(owner: Mapping[tuple[int, int], int]) -> tuple[tuple[int, ...], ...]:
        out = []
        for c in classes:
            row = [0] * holders
            row[owner[c]] = size[c]
            out.append(tuple(row))
        return tuple(out)

    start = state_of({c: c[0] for c in classes})
    goal = state_of({c: c[1] for c in classes})
    held0 = [sum(row[h] for row in start) for h in range(holders)]
    if any(held0[h] < need[h] for h in range(1, holders)):
        return False  # a model-stage without a whole copy at the start: nothing can recover it
    seen = {start}
    stack = [start]
    while stack:
        s = stack.pop()
        if s == goal:
            return True
        if len(seen) > max_states:
            return None
        total = [sum(row[h] for row in s) for h in range(holders)]
        good: list[tuple[tuple[int, ...], ...]] = []  # toward the goal: explored first
        other: list[tuple[tuple[int, ...], ...]] = []
        for k, (_, want) in enumerate(classes):
            row = s[k]
            for h in range(1, holders):
                if row[h] and total[h] > need[h]:  # release one GPU of this class
                    (other if h == want else good).append(_moved(s, k, h, 0))
            if row[0]:
                for h in range(1, holders):  # acquire one free GPU of this class
                    (good if h == want else other).append(_moved(s, k, 0, h))
        for t in other[::-1] + good[::-1]:  # the last pushed is popped first
            if t not in seen:
                seen.add(t)
                stack.append(t)
    return False


def _moved(s: tuple[tuple[int, ...], ...], k: int, a: int, b: int
           ) -> tuple[tuple[int, ...], ...]:
    row = list(s[k])
    row[a] -= 1
    row[b] += 1
    return (*s[:k], tuple(row), *s[k + 1:])
