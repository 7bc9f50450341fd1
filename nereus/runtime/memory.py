"""Virtual GPU memory of a CPU rank: real tensor bytes against a configured capacity (effectful).

Each rank plays one GPU of ``capacity_bytes``. The account sums the bytes of the real tensors the
rank holds — parameters, gradients, optimizer state of every unit on it — plus transient bytes
recorded while a model-stage runs (the KV cache of generation, activations are not traced).
Going over the capacity is an :class:`OomEvent` for the controller's urgent path; nothing here
raises or frees memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


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

    def __init__(self, global_rank: int, capacity_bytes: int) -> None:
        self.global_rank = global_rank
        self.capacity_bytes = capacity_bytes
        self.peak_bytes = 0
        self.events: list[OomEvent] = []

    def observe(self, model_stage: str, resident_bytes: int, transient_bytes: int = 0) -> None:
        """Record the bytes in use while ``model_stage`` runs; over capacity → an OOM event."""
        used = resident_bytes + transient_bytes
        self.peak_bytes = max(self.peak_bytes, used)
        if used > self.capacity_bytes:
            self.events.append(OomEvent(self.global_rank, model_stage, used, self.capacity_bytes))

    def take(self) -> tuple[int, list[OomEvent]]:
        """(peak since the last take, OOM events since then); resets both."""
        out = (self.peak_bytes, self.events)
        self.peak_bytes, self.events = 0, []
        return out


def resident_bytes(units: Iterable[tuple[torch.nn.Module, torch.optim.Optimizer | None]]) -> int:
    return sum(module_state_bytes(m, o) for m, o in units)
