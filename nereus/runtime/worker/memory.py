"""Virtual GPU memory of a CPU rank: real tensor bytes against a configured capacity (effectful).

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

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from nereus.cost.memory import CPU_WORKSPACE_BYTES, WORKSPACE_BYTES
from nereus.spec.job import Setup


def module_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of parameters, their gradients and the optimizer's tensors."""
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
    return total


@dataclass(frozen=True)
class OomEvent:
    global_rank: int
    model_stage: str
    peak_bytes: int
    capacity_bytes: int

    def to_dict(self) -> dict[str, object]:
        return {"global_rank": self.global_rank, "model_stage": self.model_stage,
                "peak_bytes": self.peak_bytes, "capacity_bytes": self.capacity_bytes}


class MemoryAccount:
    """Per-rank account; ``resident`` is re-measured at each call, transients per model-stage."""

    def __init__(self, global_rank: int, capacity_bytes: int, reserve_bytes: int = 0,
                 drop: tuple[int, int] | None = None) -> None:
        """``drop``: (step, capacity bytes from that step on)."""
        self.global_rank = global_rank
        self.capacity_bytes = capacity_bytes
        self.reserve_bytes = reserve_bytes
        self.drop = drop
        self.peak_bytes = 0
        self.events: list[OomEvent] = []

    def begin_step(self, step: int) -> None:
        """Apply the capacity drop scheduled for ``step``."""
        if self.drop is not None and step == self.drop[0]:
            self.capacity_bytes = min(self.capacity_bytes, self.drop[1])

    def observe(self, model_stage: str, resident_bytes: int, transient_bytes: int = 0) -> None:
        """Record the bytes in use while ``model_stage`` runs; over capacity → an OOM event."""
        used = self.reserve_bytes + resident_bytes + transient_bytes
        self.peak_bytes = max(self.peak_bytes, used)
        if used > self.capacity_bytes:
            self.events.append(OomEvent(self.global_rank, model_stage, used, self.capacity_bytes))

    def take(self) -> tuple[int, list[OomEvent]]:
        """(peak since the last take, OOM events since then); resets both."""
        out = (self.peak_bytes, self.events)
        self.peak_bytes, self.events = 0, []
        return out


def account_for_run(global_rank: int, setup: Setup, capacity_drop: tuple[int, float] | None
                    ) -> MemoryAccount:
    """The account of one rank of ``nereus run``: the virtual device's capacity, the planner's
    workspace reserve, the configured drop (GB → bytes as ``runtime.memory_per_rank_gb``)."""
    reserve = CPU_WORKSPACE_BYTES if setup.cluster.gpu.vendor == "cpu" else WORKSPACE_BYTES
    drop = None if capacity_drop is None else (capacity_drop[0], round(capacity_drop[1] * 1e9))
    return MemoryAccount(global_rank, setup.cluster.gpu.memory_bytes, reserve, drop)


def resident_bytes(units: Iterable[tuple[torch.nn.Module, torch.optim.Optimizer | None]]) -> int:
    return sum(module_state_bytes(m, o) for m, o in units)
