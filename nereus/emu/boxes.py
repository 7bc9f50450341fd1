"""Boxes: n-d half-open index ranges of a tensor, their intersection and difference (pure)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Box:
    """The slice ``[start[i], stop[i])`` on every axis ``i``."""

    start: tuple[int, ...]
    stop: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.start) != len(self.stop):
            raise ValueError(f"box rank mismatch: {self.start} vs {self.stop}")
        if any(b < a for a, b in zip(self.start, self.stop, strict=True)):
            raise ValueError(f"box with negative extent: {self.start}..{self.stop}")

    @staticmethod
    def of_shape(shape: tuple[int, ...]) -> Box:
        return Box(tuple(0 for _ in shape), tuple(shape))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.start, self.stop, strict=True))

    @property
    def volume(self) -> int:
        v = 1
        for n in self.shape:
            v *= n
        return v

    def is_empty(self) -> bool:
        return self.volume == 0

    def contains(self, other: Box) -> bool:
        return all(
            a <= c and d <= b
            for a, b, c, d in zip(self.start, self.stop, other.start, other.stop, strict=True)
        )

    def shift(self, offset: tuple[int, ...]) -> Box:
        """This box moved by ``offset`` (added per axis; use negatives to move back)."""
        return Box(
            tuple(a + o for a, o in zip(self.start, offset, strict=True)),
            tuple(b + o for b, o in zip(self.stop, offset, strict=True)),
        )


def intersect(a: Box, b: Box) -> Box | None:
    """The common part of two boxes of one tensor, or None when they do not overlap."""
    start = tuple(max(x, y) for x, y in zip(a.start, b.start, strict=True))
    stop = tuple(min(x, y) for x, y in zip(a.stop, b.stop, strict=True))
    if any(s >= e for s, e in zip(start, stop, strict=True)):
        return None
    return Box(start, stop)


def subtract(a: Box, b: Box) -> tuple[Box, ...]:
    """``a`` minus ``b`` as disjoint boxes (at most 2 per axis), in a deterministic order."""
    common = intersect(a, b)
    if common is None:
        return (a,)
    out: list[Box] = []
    start, stop = list(a.start), list(a.stop)
    for axis in range(len(start)):
        if start[axis] < common.start[axis]:
            lo_stop = list(stop)
            lo_stop[axis] = common.start[axis]
            out.append(Box(tuple(start), tuple(lo_stop)))
        if common.stop[axis] < stop[axis]:
            hi_start = list(start)
            hi_start[axis] = common.stop[axis]
            out.append(Box(tuple(hi_start), tuple(stop)))
        start[axis], stop[axis] = common.start[axis], common.stop[axis]
    return tuple(out)


def subtract_all(a: Box, holes: tuple[Box, ...]) -> tuple[Box, ...]:
    """``a`` minus every box in ``holes`` as disjoint boxes."""
    parts: tuple[Box, ...] = (a,)
    for h in holes:
        parts = tuple(p for part in parts for p in subtract(part, h))
    return parts
