"""Slice descriptions for shard packing: ``SliceSpec`` and its byte geometry (no torch).

A ``SliceSpec`` names a strided view of one tensor in elements; ``row_geometry`` turns it into
the byte form the kernels copy: up to three outer dims over rows of contiguous bytes, after
dropping size-1 dims and merging dims that are contiguous with each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nereus.errors import TransitionError

# Outer dims the kernels index (pack_api.h: N1, N2, S0..S2); a slice that needs more after
# merging is copied by the torch fallback.
MAX_OUTER_DIMS = 3


@dataclass(frozen=True)
class SliceSpec:
    """A strided view of ``tensors[tensor]``: element ``offset`` from its first element (its
    data pointer), element ``strides`` and ``sizes`` per dim, outermost first."""

    tensor: int
    offset: int
    strides: tuple[int, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.tensor < 0:
            raise TransitionError(f"slice of tensor {self.tensor}: negative tensor index")
        if len(self.strides) != len(self.sizes):
            raise TransitionError(f"slice strides {self.strides} vs sizes {self.sizes}: rank mismatch")
        if self.offset < 0 or any(s < 0 for s in self.strides) or any(n < 0 for n in self.sizes):
            raise TransitionError(
                f"slice offset={self.offset} strides={self.strides} sizes={self.sizes}: "
                "offset, strides and sizes must be >= 0"
            )

    @property
    def numel(self) -> int:
        n = 1
        for size in self.sizes:
            n *= size
        return n

    def last_element(self) -> int:
        """Element offset of the slice's last element (meaningful when numel > 0)."""
        return self.offset + sum((n - 1) * s for n, s in zip(self.sizes, self.strides, strict=True))


def box_pairs(box: Any) -> tuple[tuple[int, int], ...]:
    """``box`` as ((start, stop), ...): a sequence of pairs, or an object with ``start`` and
    ``stop`` tuples (like ``nereus.emu.boxes.Box``)."""
    if hasattr(box, "start") and hasattr(box, "stop"):
        return tuple((int(a), int(b)) for a, b in zip(box.start, box.stop, strict=True))
    return tuple((int(a), int(b)) for a, b in box)


def box_spec(
    tensor: int, shape: Sequence[int], strides: Sequence[int], box: Any
) -> SliceSpec:
    """The ``SliceSpec`` of the half-open box ``[start, stop)`` per dim of a tensor with this
    shape and these element strides."""
    pairs = box_pairs(box)
    if len(pairs) != len(shape):
        raise TransitionError(f"box {pairs} has {len(pairs)} dims, tensor shape {tuple(shape)}")
    for axis, ((start, stop), n) in enumerate(zip(pairs, shape, strict=True)):
        if not 0 <= start <= stop <= n:
            raise TransitionError(
                f"box {pairs} axis {axis}: needs 0 <= start <= stop <= {n} (tensor shape {tuple(shape)})"
            )
    offset = sum(start * s for (start, _), s in zip(pairs, strides, strict=True))
    return SliceSpec(
        tensor=tensor,
        offset=offset,
        strides=tuple(int(s) for s in strides),
        sizes=tuple(stop - start for start, stop in pairs),
    )


def check_inside(spec: SliceSpec, shape: Sequence[int], strides: Sequence[int]) -> None:
    """Raises TransitionError unless every element of ``spec`` lies within the memory span of a
    tensor with this shape and these strides (elements 0 .. its last element)."""
    if spec.numel == 0:
        return
    if any(n == 0 for n in shape):
        raise TransitionError(f"slice {spec} of an empty tensor of shape {tuple(shape)}")
    span_last = sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    if spec.last_element() > span_last:
        raise TransitionError(
            f"slice {spec} reaches element {spec.last_element()}, past the last element "
            f"{span_last} of its tensor (shape {tuple(shape)}, strides {tuple(strides)})"
        )


@dataclass(frozen=True)
class RowGeometry:
    """A slice in bytes: rows of ``row_bytes`` contiguous bytes over three outer dims
    (outermost first; unused dims are trailing, of size 1 and stride 0), starting
    ``offset_bytes`` from the tensor's data."""

    offset_bytes: int
    row_bytes: int
    outer_sizes: tuple[int, int, int]
    outer_strides_bytes: tuple[int, int, int]

    @property
    def rows(self) -> int:
        return self.outer_sizes[0] * self.outer_sizes[1] * self.outer_sizes[2]

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


def merged_dims(spec: SliceSpec) -> list[tuple[int, int]]:
    """(size, stride) of the slice's dims, outermost first, with size-1 dims dropped and each
    dim merged into the next inner one when they are contiguous with each other."""
    merged: list[tuple[int, int]] = []
    for n, s in reversed(list(zip(spec.sizes, spec.strides, strict=True))):
        if n == 1:
            continue
        if merged and s == merged[-1][0] * merged[-1][1]:
            inner_n, inner_s = merged[-1]
            merged[-1] = (n * inner_n, inner_s)
        else:
            merged.append((n, s))
    merged.reverse()
    return merged


def row_geometry(spec: SliceSpec, elem_bytes: int) -> RowGeometry | None:
    """The byte geometry of a non-empty slice, or None when it needs more than three outer dims
    (the kernels cannot index it; the torch fallback copies it)."""
    if spec.numel == 0:
        raise TransitionError(f"slice {spec}: empty slices have no row geometry")
    dims = merged_dims(spec)
    if dims and dims[-1][1] == 1:
        row_elems = dims[-1][0]
        outer = dims[:-1]
    else:
        row_elems = 1
        outer = dims
    if len(outer) > MAX_OUTER_DIMS:
        return None
    padded = outer + [(1, 0)] * (MAX_OUTER_DIMS - len(outer))
    return RowGeometry(
        offset_bytes=spec.offset * elem_bytes,
        row_bytes=row_elems * elem_bytes,
        outer_sizes=(padded[0][0], padded[1][0], padded[2][0]),
        outer_strides_bytes=(
            padded[0][1] * elem_bytes,
            padded[1][1] * elem_bytes,
            padded[2][1] * elem_bytes,
        ),
    )
