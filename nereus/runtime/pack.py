"""Pack slices into one contiguous buffer per peer and back (plain torch; swappable hook).

A GPU kernel version may replace these two functions; they must keep the order of ``views``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pack(views: Sequence[torch.Tensor]) -> torch.Tensor:
    """One flat buffer holding ``views`` one after another (C order each)."""
    if not views:
        return torch.empty(0)
    return torch.cat([v.reshape(-1) for v in views])


def unpack(buffer: torch.Tensor, views: Sequence[torch.Tensor]) -> None:
    """Copy consecutive parts of ``buffer`` into ``views`` (writable views of the targets)."""
    offset = 0
    for v in views:
        n = v.numel()
        v.copy_(buffer[offset:offset + n].view(v.shape))
        offset += n
    if offset != buffer.numel():
        raise ValueError(f"unpack: buffer of {buffer.numel()} values for views of {offset}")
