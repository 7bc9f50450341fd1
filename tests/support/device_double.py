"""The device transport's group creation on CPU ranks (tests/ranks/test_device_groups_gloo.py).

NCCL (RCCL) cannot run on a CPU build of torch, so these helpers stand in for it — a test double
for the vendor library only: every rank carries a placement on its own GPU (so the pure
transport choice gives ``device`` and Nereus asks for ``nccl`` groups, exactly as on a GPU node),
and :func:`nccl_as_gloo` hands each ``dist.new_group(..., backend="nccl")`` to gloo instead.
Group names, store prefixes, creation order and membership are torch's own, unchanged: a
creation order that would leave NCCL members waiting under different store prefixes leaves the
gloo members waiting the same way (both join through the store under the group's name).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch.distributed as dist

from nereus.cluster.transport import RankPlacement


def gpu_placements(world: int, shared: Sequence[int] = (), node: str = "n0"
                   ) -> tuple[RankPlacement, ...]:
    """``world`` ranks on one node, each on its own NVIDIA GPU, except that the ranks in
    ``shared`` share one GPU (the host transport between them, NCCL refuses them)."""
    first = min(shared) if shared else -1
    return tuple(RankPlacement(r, node, "cuda", "nvidia", str(first if r in shared else r))
                 for r in range(world))


@contextlib.contextmanager
def nccl_as_gloo(created: list[tuple[int, ...]] | None = None) -> Iterator[None]:
    """Within the block, ``dist.new_group(backend="nccl")`` makes a gloo group (everything else
    as torch does it); ``created`` collects the member sets of those groups in creation order."""
    real = dist.new_group

    def new_group(ranks: Any = None, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("backend") == "nccl":
            kwargs["backend"] = "gloo"
            if created is not None:
                created.append(tuple(sorted(ranks)))
        return real(ranks, *args, **kwargs)

    dist.new_group = new_group  # type: ignore[assignment]
    try:
        yield
    finally:
        dist.new_group = real
