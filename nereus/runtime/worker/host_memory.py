"""Device-like memory for CPU ranks: keep freed memory, touch the device's capacity once.

A CPU rank plays one GPU. On a GPU, PyTorch's caching allocator keeps freed blocks and hands
them out again, and the device's memory exists before the job starts: a transition writes its
target shards into memory that costs nothing to map. With glibc's defaults a CPU rank does the
opposite: large tensors are fresh ``mmap`` regions returned to the kernel on free, so every new
target tensor pays a page fault per 4 KiB page on first write — measured on the 2-core
development VMs at 1–2.8 s per GB per core, more than the transfer itself
(benchmarks/RESULTS.md, *resharding*).

:func:`retain_freed_memory` makes glibc serve every allocation from its heap and never give
freed memory back (``M_MMAP_MAX`` = 0, ``M_TRIM_THRESHOLD`` = -1): a caching allocator, as on
the GPU. :func:`reserve` then allocates, touches and frees the rank's virtual device capacity
once at start, so later allocations up to that size find mapped pages. Both are no-ops where
glibc's ``mallopt`` is missing. The rank's RSS stays at its high-water mark, as a GPU process's
reserved memory does.
"""

from __future__ import annotations

import contextlib
import ctypes
import time

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
NEVER = -1  # M_TRIM_THRESHOLD -1: never trim (mallopt(3)); INT_MAX would still trim above 2 GB


def retain_freed_memory() -> bool:
    """Serve allocations from the heap and keep freed memory; True if glibc took it."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER))
    return False


def reserve(capacity_bytes: int) -> float:
    """Allocate, touch and free ``capacity_bytes`` (after :func:`retain_freed_memory`); the
    seconds it took."""
    import torch

    t0 = time.perf_counter()
    if capacity_bytes > 0:
        block = torch.empty(capacity_bytes // 4, dtype=torch.float32)
        block.fill_(0.0)
        del block
    return time.perf_counter() - t0
