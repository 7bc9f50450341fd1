"""Memory of a rank's device against its capacity; out-of-memory errors as events (effectful).

On a GPU rank the allocator measures and enforces it (:mod:`nereus.runtime.worker.device_memory`);
a real out-of-memory error inside a guarded model-stage (:meth:`MemoryAccount.guard`) becomes a
fatal :class:`OomEvent`: the step stops, the controller replans on the urgent path with the
capacity the device reported and the step is redone. The rest of this text is the CPU rank's
virtual device.

Each rank plays one GPU of ``capacity_bytes``. The account sums the bytes of the real tensors the
rank holds — parameters, gradients, optimizer state of every unit on it — plus transient bytes
recorded while a model-stage runs (the KV cache of generation, activations are not traced), plus
``reserve_bytes``: the per-device workspace the planner reserves (``nereus.cost.memory``: gloo
buffers and allocator slack on the CPU device, which cannot be measured per tensor), so that
measured and predicted bytes compare. Going over the capacity is an :class:`OomEvent` for the
controller's urgent path (it carries the capacity, as a device reports its total memory); nothing
here raises or frees memory. ``drop`` (``runtime.capacity_drop``) lowers the capacity from a
given step on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from nereus.cost.memory import CPU_WORKSPACE_BYTES, WORKSPACE_BYTES
from nereus.errors import NereusError
from nereus.runtime.worker.device_memory import DeviceMemory
from nereus.spec.job import Setup


def module_state_bytes(model: torch.nn.Module, optimizer: Any) -> int:
    """Bytes of parameters, their gradients and the optimizer's tensors (masters included)."""
    total = 0
    for p in model.parameters():
        total += p.numel() * p.element_size()
        if p.grad is not None:
            total += p.grad.numel() * p.grad.element_size()
    if optimizer is not None:
        for st in optimizer.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    total += v.numel() * v.element_size()
        extra = getattr(optimizer, "extra_bytes", None)
        if extra is not None:
            total += int(extra())
    return total


@dataclass(frozen=True)
class OomEvent:
    """A rank over its capacity in ``model_stage``: ``source`` ``accounting`` (the measured
    bytes passed the capacity; the step ran) or ``allocator`` (the device refused an
    allocation: ``fatal``, the step did not finish and is redone after the urgent replan)."""

    global_rank: int
    model_stage: str
    peak_bytes: int
    capacity_bytes: int
    source: str = "accounting"
    fatal: bool = False
    detail: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"global_rank": self.global_rank, "model_stage": self.model_stage,
                "peak_bytes": self.peak_bytes, "capacity_bytes": self.capacity_bytes,
                "source": self.source, "fatal": self.fatal, "detail": self.detail}


class DeviceOutOfMemory(NereusError):
    """The device ran out of memory where the step cannot be redone (during training)."""


_TRIED = re.compile(r"Tried to allocate ([0-9.]+) (GiB|MiB|KiB|B)")
_UNIT = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10, "B": 1}


def requested_bytes(message: str) -> int | None:
    """The size of the allocation an out-of-memory message names, if it names one."""
    m = _TRIED.search(message)
    return None if m is None else round(float(m.group(1)) * _UNIT[m.group(2)])


class MemoryAccount:
    """Per-rank account; ``resident`` is re-measured at each call, transients per model-stage.
    With ``device_memory`` (a GPU rank) the allocator's own peak and capacity are used."""

    def __init__(self, global_rank: int, capacity_bytes: int, reserve_bytes: int = 0,
                 drop: tuple[int, int] | None = None, device_memory: DeviceMemory | None = None,
                 inject_at: int | None = None) -> None:
        """``drop``: (step, capacity bytes from that step on); ``inject_at``: the step whose
        first guarded model-stage runs out of memory (``runtime.inject_oom``)."""
        self.global_rank = global_rank
        self.device_memory = device_memory
        self.capacity_bytes = capacity_bytes if device_memory is None else \
            device_memory.capacity_bytes
        self.reserve_bytes = reserve_bytes
        self.drop = drop
        self.peak_bytes = 0
        self.events: list[OomEvent] = []
        self.inject_at = inject_at
        self.step = -1
        self.halted = False  # an allocation failed in this step: its results are incomplete

    def begin_step(self, step: int) -> None:
        """Apply the capacity drop scheduled for ``step``."""
        self.step, self.halted = step, False
        if self.drop is not None and step == self.drop[0]:
            self.capacity_bytes = min(self.capacity_bytes, self.drop[1])
            if self.device_memory is not None:
                self.device_memory.limit(self.capacity_bytes)

    def observe(self, model_stage: str, resident_bytes: int, transient_bytes: int = 0) -> None:
        """Record the bytes in use while ``model_stage`` runs (on a GPU: the allocator's peak
        since the last call); over capacity → an OOM event."""
        if self.device_memory is not None:
            used = self.reserve_bytes + self.device_memory.take_peak()
        else:
            used = self.reserve_bytes + resident_bytes + transient_bytes
        self.peak_bytes = max(self.peak_bytes, used)
        if used > self.capacity_bytes:
            self.events.append(OomEvent(self.global_rank, model_stage, used, self.capacity_bytes))

    def guard(self, model_stage: str, redo: bool = True) -> OomGuard:
        """A context for a model-stage's work: an out-of-memory error inside becomes a fatal
        :class:`OomEvent` (bytes held plus the allocation refused, against the capacity) and
        marks the step ``halted``. ``redo``: the step can be redone — the error is swallowed and
        the caller skips what depended on it; otherwise :class:`DeviceOutOfMemory` is raised.
        ``runtime.inject_oom`` fires as the guarded work ends (its results are then dropped)."""
        return OomGuard(self, model_stage, redo)

    def record_oom(self, model_stage: str, e: BaseException) -> str:
        """The fatal event of an out-of-memory error; returns its first line."""
        first = str(e).splitlines()[0] if str(e) else "out of memory"
        held = self.device_memory.in_use() if self.device_memory is not None else 0
        if self.device_memory is not None:
            self.device_memory.release()
        asked = requested_bytes(str(e))
        peak = self.reserve_bytes + held + (asked if asked is not None else 1)
        peak = max(peak, self.capacity_bytes + 1)
        self.events.append(OomEvent(self.global_rank, model_stage, peak, self.capacity_bytes,
                                    "allocator", True, first[:200]))
        self.peak_bytes = max(self.peak_bytes, peak)
        self.halted = True
        return first

    def inject(self) -> None:
        """``runtime.inject_oom``: on a GPU a real allocation of more than the allocator may
        take; on a CPU rank the error the allocator would raise."""
        if self.device_memory is not None:
            n = self.device_memory.free_bytes() + (64 << 20)
            torch.empty(n, dtype=torch.uint8, device=self.device_memory.device)  # raises
        n = max(self.capacity_bytes - self.reserve_bytes, 0) + (1 << 20)
        raise torch.OutOfMemoryError(
            f"injected out of memory (runtime.inject_oom). Tried to allocate {n} B")

    def take(self) -> tuple[int, list[OomEvent]]:
        """(peak since the last take, OOM events since then); resets both."""
        out = (self.peak_bytes, self.events)
        self.peak_bytes, self.events = 0, []
        return out


class OomGuard:
    """:meth:`MemoryAccount.guard`'s context."""

    def __init__(self, account: MemoryAccount, model_stage: str, redo: bool) -> None:
        self.account, self.model_stage, self.redo = account, model_stage, redo

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None,
                 tb: Any) -> bool:
        acc = self.account
        if e is None and acc.inject_at is not None and acc.step == acc.inject_at:
            acc.inject_at = None
            try:
                acc.inject()
            except torch.OutOfMemoryError as injected:
                e = injected
        if not isinstance(e, torch.OutOfMemoryError):
            return False
        first = acc.record_oom(self.model_stage, e)
        if not self.redo:
            raise DeviceOutOfMemory(
                f"rank {acc.global_rank}: out of device memory in {self.model_stage} at step "
                f"{acc.step} during training ({first[:160]}); the step cannot be redone once "
                "an update ran") from e
        return True


def account_for_run(global_rank: int, setup: Setup, capacity_drop: tuple[int, float] | None,
                    device: torch.device | None = None, inject_oom: tuple[int, int] | None = None
                    ) -> MemoryAccount:
    """The account of one rank of ``nereus run``: the device's capacity (the virtual device's
    on a CPU rank; on a GPU the configured capacity, at most the device's, enforced on its
    allocator), the planner's workspace reserve, the configured drop (GB → bytes as
    ``runtime.memory_per_rank_gb``), an injected out-of-memory error for this rank."""
    gpu = setup.cluster.gpu_of(global_rank)  # this rank's hardware (a node group's, if mixed)
    reserve = CPU_WORKSPACE_BYTES if gpu.vendor == "cpu" else WORKSPACE_BYTES
    drop = None if capacity_drop is None else (capacity_drop[0], round(capacity_drop[1] * 1e9))
    dm = None
    if device is not None and device.type == "cuda":
        dm = DeviceMemory(device, gpu.memory_bytes, reserve)
    inject = inject_oom[1] if inject_oom is not None and inject_oom[0] == global_rank else None
    return MemoryAccount(global_rank, gpu.memory_bytes, reserve, drop, dm, inject)


def resident_bytes(units: Iterable[tuple[torch.nn.Module, Any]]) -> int:
    return sum(module_state_bytes(m, o) for m, o in units)
