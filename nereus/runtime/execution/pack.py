"""How one peer pair's moves travel: contiguous views sent as they are, the rest packed.

Both ends derive the same split from the plan and the local shapes alone (:func:`pair_messages`):
an item (one move, one field) whose source slice is one contiguous range of the sender's tensor
and holds at least :data:`DIRECT_MIN_VALUES` values is its own message, sent straight from the
live tensor (no copy) and received straight into the destination when that slice is contiguous
too (else into a buffer, then copied). Every other item of the pair is packed, in plan order,
into one buffer. This is the torch fallback of the packer (:mod:`nereus.runtime.execution.packer`);
the compiled kernels replace :func:`pack` / :func:`unpack` on GPUs, keeping the order of
``views``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nereus.emu.boxes import Box

DIRECT_MIN_VALUES = 1 << 16  # 256 KiB of fp32: below this a message costs more than a copy


def box_is_contiguous(box: Box, shape: Sequence[int]) -> bool:
    """Whether ``box`` of a C-order array of ``shape`` is one contiguous range of it."""
    extent = box.shape
    axis = len(shape) - 1
    while axis >= 0 and extent[axis] == shape[axis]:
        axis -= 1
    return all(e == 1 for e in extent[:max(axis, 0)])


@dataclass(frozen=True)
class PairMessages:
    """Indices into a pair's item list: ``direct`` items are one message each (in order),
    ``packed`` items share one buffer (in order)."""

    direct: tuple[int, ...]
    packed: tuple[int, ...]


def pair_messages(values: Sequence[int], src_contiguous: Sequence[bool]) -> PairMessages:
    """Split a pair's items (their value counts and source contiguity) into messages."""
    direct = tuple(i for i, (n, c) in enumerate(zip(values, src_contiguous, strict=True))
                   if c and n >= DIRECT_MIN_VALUES)
    chosen = set(direct)
    return PairMessages(direct, tuple(i for i in range(len(values)) if i not in chosen))


def pack(views: Sequence[torch.Tensor], length: int | None = None) -> torch.Tensor:
    """One flat buffer holding ``views`` one after another (C order each), zero-padded to
    ``length`` values when given."""
    total = sum(v.numel() for v in views)
    if length is not None and length < total:
        raise ValueError(f"pack: {total} values do not fit a buffer of {length}")
    dtype = views[0].dtype if views else torch.float32
    device = views[0].device if views else None
    out = torch.empty(total if length is None else length, dtype=dtype, device=device)
    offset = 0
    for v in views:
        n = v.numel()
        out[offset:offset + n].view(v.shape).copy_(v)
        offset += n
    out[total:].zero_()
    return out


def unpack(buffer: torch.Tensor, views: Sequence[torch.Tensor]) -> None:
    """Copy consecutive parts of ``buffer`` into ``views`` (writable views of the targets)."""
    offset = 0
    for v in views:
        n = v.numel()
        v.copy_(buffer[offset:offset + n].view(v.shape))
        offset += n
    if offset != buffer.numel():
        raise ValueError(f"unpack: buffer of {buffer.numel()} values for views of {offset}")
