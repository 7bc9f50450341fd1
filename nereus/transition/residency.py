"""Co-residency: which model-stages may share a GPU, and the per-GPU memory bound that follows.

Model-stages of different phases of one workflow lane run one after another and may keep their
units on the same GPUs; model-stages that run concurrently (and units of one model-stage) need
disjoint GPUs. The relation is *exclusive(a, b)*: ``a == b`` or ``conflicts(a, b)``. The default
(no relation given) makes every two distinct model-stages conflict: no GPU is shared.

Memory bound: at any instant the model-stages that hold bytes on a GPU are pairwise
non-exclusive, and each holds at most its *level* there (the largest of its resident units' bytes
and its primitives' peaks on that GPU). So the bytes on a GPU never exceed the largest sum of
levels over an independent set of the conflict graph; :func:`memory_excess` checks that bound for
every GPU at once (one matrix product over the maximal independent sets).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import combinations

import numpy as np

Conflicts = Callable[[str, str], bool]
# what callers may pass: a predicate, the set of conflicting pairs, or None (all conflict)
ConflictSpec = Conflicts | frozenset[tuple[str, str]] | None

MAX_STAGES_ENUMERATED = 16  # maximal independent sets are enumerated by subsets below this


@dataclass(frozen=True)
class Exclusion:
    """The conflict relation over ``names``; ``pairs`` None means every distinct pair conflicts."""

    names: tuple[str, ...]
    pairs: frozenset[tuple[str, str]] | None

    def exclusive(self, a: str, b: str) -> bool:
        """True when units of ``a`` and ``b`` may not hold one GPU at the same time."""
        if a == b or self.pairs is None:
            return True
        return (a, b) in self.pairs if a < b else (b, a) in self.pairs

    def conflicts(self, a: str, b: str) -> bool:
        return a != b and self.exclusive(a, b)

    @cached_property
    def index(self) -> dict[str, int]:
        return {m: i for i, m in enumerate(self.names)}

    @cached_property
    def sets_matrix(self) -> np.ndarray:
        """0/1 matrix (maximal independent sets × names)."""
        return _independent_sets(self.names, self.pairs)


def _normal_pairs(names: Iterable[str], conflicts: Conflicts) -> frozenset[tuple[str, str]]:
    return frozenset((a, b) for a, b in combinations(sorted(set(names)), 2) if conflicts(a, b))


@lru_cache(maxsize=256)
def _exclusion(names: tuple[str, ...], pairs: frozenset[tuple[str, str]] | None) -> Exclusion:
    return Exclusion(names, pairs)


def exclusion_for(names: Iterable[str], conflicts: ConflictSpec | Exclusion = None) -> Exclusion:
    """The :class:`Exclusion` over ``names`` for a predicate, a pair set or None."""
    ordered = tuple(sorted(set(names)))
    if isinstance(conflicts, Exclusion):
        conflicts = conflicts.pairs
    if conflicts is None:
        return _exclusion(ordered, None)
    if isinstance(conflicts, frozenset):
        inside = set(ordered)
        pairs = frozenset((min(a, b), max(a, b)) for a, b in conflicts
                          if a != b and a in inside and b in inside)
    else:
        pairs = _normal_pairs(ordered, conflicts)
    if len(pairs) == len(ordered) * (len(ordered) - 1) // 2:
        return _exclusion(ordered, None)
    return _exclusion(ordered, pairs)


@lru_cache(maxsize=256)
def _independent_sets(names: tuple[str, ...], pairs: frozenset[tuple[str, str]] | None
                      ) -> np.ndarray:
    n = len(names)
    if pairs is None or n == 0:
        return np.eye(n, dtype=np.int64)
    if n > MAX_STAGES_ENUMERATED:
        raise ValueError(f"{n} model-stages: too many to enumerate independent sets")
    idx = {m: i for i, m in enumerate(names)}
    clash = [0] * n
    for a, b in pairs:
        clash[idx[a]] |= 1 << idx[b]
        clash[idx[b]] |= 1 << idx[a]
    indep = [s for s in range(1, 1 << n)
             if all(not (s >> i) & 1 or not clash[i] & s for i in range(n))]
    maximal = [s for s in indep
               if all((s >> i) & 1 or clash[i] & s for i in range(n))]
    return np.array([[(s >> i) & 1 for i in range(n)] for s in maximal], dtype=np.int64)


Levels = Mapping[str, Mapping[int, int]]  # model-stage → GPU → bytes it may hold there


def memory_excess(
    levels: Levels,
    excl: Exclusion,
    capacity_bytes: int | Mapping[int, int],
    reserved_bytes: Mapping[int, int] | None = None,
) -> str | None:
    """None when every GPU's bound fits its capacity, else the reason for the first that does not."""
    bad = excess_gpus(levels, excl, capacity_bytes, reserved_bytes, first=True)
    return bad[0][1] if bad else None


def excess_gpus(
    levels: Levels,
    excl: Exclusion,
    capacity_bytes: int | Mapping[int, int],
    reserved_bytes: Mapping[int, int] | None = None,
    *,
    first: bool = False,
) -> list[tuple[int, str]]:
    """``(GPU, reason)`` for every GPU whose bound exceeds its capacity (ascending GPU ids)."""
    reserved = reserved_bytes or {}
    out: list[tuple[int, str]] = []
    if excl.pairs is None:  # no GPU is shared: each model-stage's level alone
        for m, lv in levels.items():
            for g, b in lv.items():
                cap_g = capacity_bytes if isinstance(capacity_bytes, int) else capacity_bytes[g]
                if b + reserved.get(g, 0) > cap_g:
                    out.append((g, f"{b + reserved.get(g, 0)} bytes on GPU {g} ({m} {b}) > "
                                   f"capacity {cap_g}"))
                    if first:
                        return out
        return sorted(out)
    gpus = sorted({g for lv in levels.values() for g in lv})
    if not gpus:
        return out
    col = {g: k for k, g in enumerate(gpus)}
    mat = np.zeros((len(excl.names), len(gpus)), dtype=np.int64)
    for m, lv in levels.items():
        row = excl.index[m]
        for g, b in lv.items():
            mat[row, col[g]] = b
    sums = excl.sets_matrix @ mat  # (sets × GPUs)
    best = sums.max(axis=0)
    if reserved:
        best = best + np.array([reserved.get(g, 0) for g in gpus], dtype=np.int64)
    if isinstance(capacity_bytes, int):
        cap = np.full(len(gpus), capacity_bytes, dtype=np.int64)
    else:
        cap = np.array([capacity_bytes[g] for g in gpus], dtype=np.int64)
    for k in np.flatnonzero(best > cap).tolist():
        which = excl.sets_matrix[int(sums[:, k].argmax())]
        held = [(m, int(mat[i, k])) for i, m in enumerate(excl.names) if which[i] and mat[i, k]]
        parts = " + ".join(f"{m} {b}" for m, b in held)
        out.append((gpus[k], f"{int(best[k])} bytes on GPU {gpus[k]} ({parts}) > capacity "
                             f"{int(cap[k])}"))
        if first:
            break
    return out


def raise_level(levels: dict[str, dict[int, int]], model_stage: str,
                per_gpu: Mapping[int, int]) -> None:
    """Record that ``model_stage`` may hold ``per_gpu`` bytes (keeps the maximum per GPU)."""
    lv = levels.setdefault(model_stage, {})
    for g, b in per_gpu.items():
        if b > lv.get(g, 0):
            lv[g] = b
