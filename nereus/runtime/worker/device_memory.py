"""A GPU's memory as its allocator sees it: capacity, peaks, an enforced limit (effectful).

On a GPU rank the memory account (:mod:`nereus.runtime.worker.memory`) reads real numbers
instead of summing tensor sizes: the device's total from ``torch.cuda.mem_get_info``, the peak
the caching allocator reached while a model-stage ran (``memory_stats``' allocated peak, reset after each
reading), the bytes it holds now. The capacity the job plans with (``cluster.gpu`` memory,
``runtime.memory_per_rank_gb``, a ``capacity_drop``) is enforced for real: the allocator is
limited to it (``set_per_process_memory_fraction``), less the workspace the planner reserves for
what the allocator does not see (CUDA context, NCCL buffers), so a plan that outgrows the
capacity meets a real out-of-memory error, which the runtime turns into an urgent replan.
"""

from __future__ import annotations

import torch


class DeviceMemory:
    """The allocator of ``device`` limited to ``capacity_bytes`` − ``reserve_bytes``."""

    def __init__(self, device: torch.device, capacity_bytes: int, reserve_bytes: int) -> None:
        self.device = device
        self.reserve_bytes = reserve_bytes
        self.total_bytes = int(torch.cuda.mem_get_info(device)[1])
        self.capacity_bytes = 0
        self.limit(capacity_bytes)
        torch.cuda.reset_peak_memory_stats(device)

    def limit(self, capacity_bytes: int) -> None:
        """Plan with ``capacity_bytes`` (at most the device's) and hold the allocator to it."""
        self.capacity_bytes = min(int(capacity_bytes), self.total_bytes)
        allocator = max(self.capacity_bytes - self.reserve_bytes, 0)
        torch.cuda.set_per_process_memory_fraction(allocator / self.total_bytes, self.device)

    def take_peak(self) -> int:
        """The allocator's peak since the last reading (``memory_stats``; then reset to what it
        holds now)."""
        peak = int(torch.cuda.memory_stats(self.device).get("allocated_bytes.all.peak", 0))
        torch.cuda.reset_peak_memory_stats(self.device)
        return peak

    def in_use(self) -> int:
        return int(torch.cuda.memory_allocated(self.device))

    def free_bytes(self) -> int:
        """What the allocator may still take: the limit less what it holds, and what the device
        has free."""
        limit = max(self.capacity_bytes - self.reserve_bytes, 0)
        return max(0, min(limit - self.in_use(), int(torch.cuda.mem_get_info(self.device)[0])))

    def release(self) -> None:
        """Cached blocks back to the device (after an out-of-memory error)."""
        torch.cuda.empty_cache()
