"""This rank's device, every rank's placement, and the device communicators (effectful).

:class:`RankDevice` is made once per rank at start (``nereus.runtime.worker.main``) from the pure
choices (:mod:`nereus.cluster.devices`, :mod:`nereus.cluster.transport`) and passed explicitly
to everything that creates tensors or groups: the plan's units, the executor, the weight sync.
It answers, for a set of member ranks, the transport (``device`` or ``host``), the backend of a
unit group (``nccl`` — RCCL on ROCm — or ``gloo``) and whether a host group stages device
tensors through pinned host buffers; it keeps the device communicators of transitions in a
cache keyed by member set (an NCCL communicator costs ~0.6 s to create; a member set recurs at
every weight sync), each with a bounded timeout, and aborts them all when a peer failed, so no
rank hangs in one. On the CPU it is the embedded default: gloo everywhere, fp32, torch packing.

Device communicators are created *collectively*: every rank of the job asks for every member
set, in the one order all ranks agree on (the DAG's waves, the weight syncs), and torch's
``new_group`` names each group by a count every rank advances alike. A group made by its members
alone (``use_local_synchronization=True``) is named from the groups *this* rank has registered
— members and non-members of earlier groups disagree — so its members wait under different store
prefixes until they time out (tests/ranks/test_device_groups_gloo.py).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from nereus.cluster.devices import DeviceChoice, cpu_choice
from nereus.cluster.transport import (
    DEVICE,
    NCCL,
    RankPlacement,
    backend_of,
    cpu_placements,
    group_transport,
    label,
    staged,
)
from nereus.errors import CommunicationError
from nereus.runtime.execution.packer import Packer, process_packer


class RankDevice:
    """One rank's device (``device``, parameter dtype ``dtype``: bf16 on GPUs with fp32 master
    weights and Adam state, fp32 on CPUs) and the placements of all ``world`` ranks."""

    def __init__(self, choice: DeviceChoice, placements: Sequence[RankPlacement], rank: int,
                 *, dtype: torch.dtype | None = None, packer: Packer | None = None) -> None:
        self.choice = choice
        self.placements = tuple(placements)
        self.rank = rank
        self.device = torch.device(choice.torch_device)
        self.dtype = dtype if dtype is not None else (
            torch.bfloat16 if choice.on_gpu else torch.float32)
        self.packer = packer if packer is not None else process_packer(self.device.type)
        # Host groups stage their tensors through host buffers even when they are host tensors
        # already: the staged path of GPU ranks, run by the CPU tests.
        self.force_staging = False
        self.generation_reason = ""  # why runtime.generation resolved as it did (for the log)
        # member set → its communicator (None on a non-member): the same keys on every rank
        self._device_groups: dict[tuple[int, ...], Any | None] = {}
        self._aborted = False

    @staticmethod
    def cpu(rank: int, world: int, *, packer: Packer | None = None) -> RankDevice:
        """The embedded default: every rank a CPU rank."""
        return RankDevice(cpu_choice("CPU ranks"), cpu_placements(world), rank, packer=packer)

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def mixed_precision(self) -> bool:
        """Parameters in a 16-bit type, fp32 master weights and Adam state beside them."""
        return self.dtype != torch.float32

    # -- transports --------------------------------------------------------------------------

    def transport(self, members: Iterable[int]) -> str:
        return group_transport(members, self.placements)

    def backend(self, members: Iterable[int]) -> str:
        """torch.distributed's backend for a group of ``members`` (the same on every rank)."""
        return backend_of(self.transport(members))

    def staged(self, members: Iterable[int]) -> bool:
        ms = list(members)
        return (self.force_staging and self.transport(ms) != DEVICE) or staged(ms, self.placements)

    def label(self, members: Iterable[int]) -> str:
        ms = list(members)
        name = label(self.transport(ms), self.placements, ms)
        return name + "-forced" if self.force_staging and name == "host:gloo" else name

    # -- device communicators ----------------------------------------------------------------

    def device_group(self, members: Sequence[int], timeout_s: float) -> Any | None:
        """The device communicator of ``members`` on a member, None elsewhere: a registered
        ``nccl`` group with a bounded timeout, created on first use and then reused.

        Collective over the job: every rank calls it for every member set, in the same order
        (the cache then holds the same keys on every rank, so every rank creates the same groups
        at the same calls). Raises CommunicationError after :meth:`abort`."""
        if self._aborted:
            raise CommunicationError(
                f"rank {self.rank}: the device communicators were aborted after a failure; "
                "a new attempt of the job creates its own")
        key = tuple(sorted(set(members)))
        if key not in self._device_groups:
            pg = dist.new_group(list(key), timeout=timedelta(seconds=timeout_s), backend=NCCL)
            self._device_groups[key] = pg if self.rank in key else None
        return self._device_groups[key]

    def abort(self) -> None:
        """A peer failed: abort every device communicator (their pending work raises instead of
        waiting), and forget them; no more are created on this device (the ranks would no
        longer agree on which exist)."""
        self._aborted = True
        for pg in self._device_groups.values():
            # already aborted or destroyed: nothing is waiting on it
            with contextlib.suppress(Exception):
                if pg is not None:
                    pg.abort()
        self._device_groups.clear()

    def destroy(self) -> None:
        """Destroy the device communicators (end of the run)."""
        for pg in self._device_groups.values():
            with contextlib.suppress(Exception):
                if pg is not None:
                    dist.destroy_process_group(pg)
        self._device_groups.clear()

    # -- memory ------------------------------------------------------------------------------

    def release_memory(self) -> None:
        """Give memory of dropped units back to the device (the caching allocator keeps freed
        blocks otherwise); CPU ranks keep theirs (``host_memory``: a CPU rank plays a device
        whose memory is mapped once)."""
        if self.on_gpu:
            gc.collect()
            torch.cuda.empty_cache()

    def synchronize(self) -> None:
        """Wait for this rank's device work (a measured time then includes it)."""
        if self.on_gpu:
            torch.cuda.synchronize(self.device)
