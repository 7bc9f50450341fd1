"""Mixed precision for a unit on a GPU: bf16 parameters, fp32 master weights, gradients and Adam
state (effectful; what Megatron's ``Float16OptimizerWithFloat16Params`` does, per unit).

The model computes in bf16. Each parameter has an fp32 master copy; backward's bf16 gradient
is added into the master's fp32 gradient as soon as it is complete (a post-accumulate hook, as
Megatron's ``main_grad`` buffers), so microbatches accumulate in fp32 and the DP all-reduce sums
fp32 values; Adam (fp32 ``exp_avg``, ``exp_avg_sq``) steps on the masters, which are then cast
into the parameters. The EMU logical state of such a unit is the masters and the moments — all
fp32, so transfer plans, checkpoints and the weight sync move the same 4-byte values as on CPU
ranks — and :meth:`MixedPrecisionAdam.refresh` writes the bf16 parameters after anything wrote
the masters. CPU ranks keep plain fp32 ``torch.optim.Adam`` (no masters).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


class MixedPrecisionAdam:
    """Adam over fp32 masters of a module's (16-bit) parameters; ``state`` is keyed by the
    module's parameters, like ``torch.optim.Adam``'s, and holds the masters' moments."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float,
                 initialize: bool = True) -> None:
        self.params = params
        make = (lambda p: p.detach().float().clone()) if initialize else \
            (lambda p: torch.empty(p.shape, dtype=torch.float32, device=p.device))
        self.masters: dict[torch.nn.Parameter, torch.Tensor] = {p: make(p) for p in params}
        self.inner = torch.optim.Adam(list(self.masters.values()), lr=lr)
        self._hooks = [p.register_post_accumulate_grad_hook(self._fold) for p in params]

    def _fold(self, p: torch.Tensor) -> None:
        """Backward finished ``p``'s gradient: add it to the master's fp32 gradient."""
        assert isinstance(p, torch.nn.Parameter) and p.grad is not None
        master = self.masters[p]
        if master.grad is None:
            master.grad = p.grad.float()
        else:
            master.grad.add_(p.grad)
        p.grad = None

    @property
    def state(self) -> dict[torch.nn.Parameter, dict[str, Any]]:
        """parameter → its master's Adam state (the same dicts the inner optimizer updates)."""
        return {p: self.inner.state[m] for p, m in self.masters.items()}

    def set_state(self, p: torch.nn.Parameter, value: dict[str, Any]) -> None:
        self.inner.state[self.masters[p]] = value

    def master(self, p: torch.nn.Parameter) -> torch.Tensor:
        return self.masters[p]

    def grads(self) -> Iterator[torch.Tensor]:
        """The fp32 gradients Adam steps on (those present)."""
        return (m.grad for m in self.masters.values() if m.grad is not None)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p, m in self.masters.items():
            p.grad = None
            m.grad = None

    def step(self) -> None:
        self.inner.step()
        self.refresh()

    def refresh(self) -> None:
        """Cast the masters into the parameters."""
        with torch.no_grad():
            for p, m in self.masters.items():
                p.copy_(m)

    def extra_bytes(self) -> int:
        """Bytes of the masters and their gradients (beyond parameters and Adam state)."""
        return sum(m.numel() * m.element_size() * (1 if m.grad is None else 2)
                   for m in self.masters.values())

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
