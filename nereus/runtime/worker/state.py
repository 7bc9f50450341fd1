"""The EMU logical state Λ held by one rank: model shards, Adam state, counters (effectful).

Λ = (θ parameters, ω Adam exp_avg / exp_avg_sq / step, update counters, model-stage and policy
versions, minibatch position p). RNG and dataloader state are not stored: a replica derives them
from its DP rank and p in a global sample order (:func:`minibatch_samples`, :func:`replica_rng`),
so a new replica repeats or skips no sample.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch

from nereus.emu.shards import LocalShard, shards_at
from nereus.emu.unit import Emu
from nereus.engines.megatron_model import StageGroups, build_gpt
from nereus.rl.sample_order import replica_slice
from nereus.runtime.execution.device import RankDevice
from nereus.runtime.failures.checkpoint import FIELDS
from nereus.runtime.worker.precision import MixedPrecisionAdam
from nereus.spec.model import ModelSpec


@dataclass
class Counters:
    """Update counter, versions and the minibatch position p of the last completed update."""

    updates: int = 0
    model_stage_version: int = 0
    policy_version: int = 0
    position: int = 0


Optimizer = torch.optim.Adam | MixedPrecisionAdam


@dataclass
class UnitState:
    """This rank's part of one EMU: a Megatron GPTModel stage and its Adam optimizer (on a GPU
    with bf16 parameters: :class:`MixedPrecisionAdam`, whose fp32 masters are the state)."""

    spec: ModelSpec
    emu: Emu
    global_rank: int
    groups: StageGroups
    model: torch.nn.Module
    optimizer: Optimizer
    counters: Counters = field(default_factory=Counters)
    device: RankDevice | None = None  # None: a CPU rank

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu") if self.device is None else self.device.device

    def master_of(self, p: torch.nn.Parameter) -> torch.Tensor:
        """The tensor holding ``p``'s logical value: its fp32 master, or its data."""
        if isinstance(self.optimizer, MixedPrecisionAdam):
            return self.optimizer.master(p)
        return p.data

    def refresh_model(self) -> None:
        """After the logical state was written (a transfer, a load): the parameters from it."""
        if isinstance(self.optimizer, MixedPrecisionAdam):
            self.optimizer.refresh()

    def grads(self) -> list[torch.Tensor]:
        """The gradients the optimizer steps on (fp32 masters' under mixed precision)."""
        if isinstance(self.optimizer, MixedPrecisionAdam):
            return list(self.optimizer.grads())
        return [p.grad for p in self.model.parameters() if p.grad is not None]

    @property
    def position(self) -> tuple[int, int]:
        """(pp_rank, tp_rank) of this rank in the unit."""
        pp_rank, tp_rank = divmod(self.emu.gpus.index(self.global_rank), self.emu.layout.tp)
        return pp_rank, tp_rank

    def shards(self) -> tuple[LocalShard, ...]:
        pp_rank, tp_rank = self.position
        return shards_at(self.spec, self.emu.layout, pp_rank, tp_rank)

    def tensors(self) -> dict[str, dict[str, torch.Tensor]]:
        """field → local key → the live tensor (parameter data or Adam moment)."""
        params = dict(self.model.named_parameters())
        out: dict[str, dict[str, torch.Tensor]] = {f: {} for f in FIELDS}
        for s in self.shards():
            p = params[s.local_key]
            st = self.optimizer.state[p]
            out["param"][s.local_key] = self.master_of(p)
            out["exp_avg"][s.local_key] = st["exp_avg"]
            out["exp_avg_sq"][s.local_key] = st["exp_avg_sq"]
        return out

    def step_value(self) -> float:
        steps = {float(st["step"]) for st in self.optimizer.state.values()}
        if len(steps) != 1:
            raise ValueError(f"inconsistent Adam steps {steps}")
        return steps.pop()

    def snapshot(self) -> dict[str, dict[str, np.ndarray]]:
        """A copy of the local tensors as numpy arrays (for checks and reassembly)."""
        return {f: {k: host_array(t) for k, t in d.items()} for f, d in self.tensors().items()}


def host_array(t: torch.Tensor) -> np.ndarray:
    """A numpy copy of ``t`` wherever it lives."""
    return t.detach().to("cpu", copy=True).numpy()


def new_unit_state(spec: ModelSpec, emu: Emu, global_rank: int, groups: StageGroups, *,
                   lr: float = 1e-3, seed: int = 0, step: float = 0.0,
                   counters: Counters | None = None, initialize: bool = True,
                   device: RankDevice | None = None) -> UnitState:
    """Build the stage model and an Adam optimizer whose state exists from the start.

    ``initialize=True``: Megatron's initial weights and zero moments. ``initialize=False``: a
    unit about to be filled (a transfer target, a checkpoint load): parameters and moments are
    left unwritten — the caller writes every value, so nothing is spent zeroing memory that is
    overwritten at once. ``device``: where the model lives and in which dtype (None: fp32 on
    the CPU); a 16-bit dtype gets fp32 masters (:class:`MixedPrecisionAdam`)."""
    pp_rank, _ = divmod(emu.gpus.index(global_rank), emu.layout.tp)
    where = torch.device("cpu") if device is None else device.device
    dtype = torch.float32 if device is None else device.dtype
    model = build_gpt(spec, emu.layout.tp, emu.layout.pp, pp_rank, groups, seed=seed,
                      initialize=initialize, device=where, dtype=dtype)
    params = list(model.parameters())
    opt: Optimizer
    if dtype == torch.float32:
        opt = torch.optim.Adam(params, lr=lr)
        moment = torch.zeros_like if initialize else torch.empty_like
        for p in params:
            opt.state[p] = {"step": torch.tensor(float(step)),
                            "exp_avg": moment(p.data),
                            "exp_avg_sq": moment(p.data)}
    else:
        opt = MixedPrecisionAdam(params, lr, initialize=initialize)
        for p in params:
            m = opt.master(p)
            make = torch.zeros_like if initialize else torch.empty_like
            opt.set_state(p, {"step": torch.tensor(float(step)), "exp_avg": make(m),
                              "exp_avg_sq": make(m)})
    return UnitState(spec, emu, global_rank, groups, model, opt, counters or Counters(),
                     device)


def load_global(state: UnitState, glob: dict[str, dict[str, np.ndarray]]) -> None:
    """Fill this rank's shards from a global logical state (field → tensor name → array)."""
    live = state.tensors()
    for s in state.shards():
        for f in FIELDS:
            dst = live[f][s.local_key]
            for pc in s.pieces:
                src = glob[f][s.tensor][tuple(slice(a, b) for a, b in
                                              zip(pc.global_.start, pc.global_.stop, strict=True))]
                dst[tuple(slice(a, b) for a, b in zip(pc.local.start, pc.local.stop,
                                                      strict=True))] = torch.from_numpy(src)
    state.refresh_model()


def _seed_of(*parts: int) -> int:
    digest = hashlib.sha256(",".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def minibatch_samples(seed: int, num_samples: int, global_batch: int, position: int,
                      dp_rank: int, dp: int) -> np.ndarray:
    """Sample indices of replica ``dp_rank`` (of ``dp``) for minibatch ``position``.

    The global order is a fixed permutation per epoch; minibatch p is its slice
    [p·G, (p+1)·G) (wrapping into later epochs), cut into dp contiguous parts
    (:func:`nereus.rl.sample_order.replica_slice`: ⌈G/dp⌉ or ⌊G/dp⌋ each), so any dp sees each
    sample of a minibatch exactly once.
    """
    lo, hi = replica_slice(global_batch, dp, dp_rank)
    start = position * global_batch
    epoch, offset = divmod(start, num_samples)
    order = np.concatenate([
        np.random.default_rng(_seed_of(seed, e)).permutation(num_samples)
        for e in range(epoch, epoch + 2 + global_batch // num_samples)
    ])
    return order[offset:offset + global_batch][lo:hi]


def replica_rng(seed: int, dp_rank: int, position: int) -> torch.Generator:
    """The RNG of replica ``dp_rank`` at minibatch ``position`` (e.g. for dropout, sampling)."""
    return torch.Generator().manual_seed(_seed_of(seed, dp_rank, position) % (2**63))
