"""Split / Merge / Extend / Destroy as frozen records with their transfer plans (pure).

GPU arrangement (chosen so that the position-wise all-gather of a Split is exactly the minimum
and a Merge copies nothing): splitting layout (tp, pp) into (tp/kt, pp/kp), the GPU at position
(p, t) joins sub-unit ``(p % kp) * kt + t % kt`` at position (p // kp, t // kt). Merge is the
inverse. Every source GPU then already holds its merged shard, and in a Split the GPUs that share
a new position (a block of kt·kp GPUs) each need exactly the others' shards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nereus.emu.transfer import TransferPlan, plan_transfer
from nereus.emu.unit import Emu, Layout
from nereus.errors import TransitionError
from nereus.spec.model import ModelSpec


def _factors(big: Layout, small: Layout) -> tuple[int, int]:
    if not small.divides(big):
        raise TransitionError(f"{small} does not divide {big}")
    return big.tp // small.tp, big.pp // small.pp


def split_units(emu: Emu, sub: Layout) -> tuple[Emu, ...]:
    """The k sub-units of ``emu`` with layout ``sub`` on the same GPUs."""
    kt, kp = _factors(emu.layout, sub)
    grids: list[list[int]] = [[-1] * sub.size for _ in range(kt * kp)]
    for p in range(emu.layout.pp):
        for t in range(emu.layout.tp):
            unit = (p % kp) * kt + t % kt
            grids[unit][(p // kp) * sub.tp + t // kt] = emu.gpu_at(p, t)
    return tuple(Emu(emu.model_stage, emu.state, sub, tuple(g)) for g in grids)


def merged_unit(units: Sequence[Emu], layout: Layout) -> Emu:
    """The unit that :func:`split_units` would split into ``units`` (given in sub-unit order)."""
    if not units:
        raise TransitionError("merge of no units")
    sub = units[0].layout
    kt, kp = _factors(layout, sub)
    if len(units) != kt * kp:
        raise TransitionError(f"merging {len(units)} units of {sub} into {layout} needs {kt * kp}")
    for u in units:
        if u.layout != sub or u.state != units[0].state or u.model_stage != units[0].model_stage:
            raise TransitionError(f"merge of non-replicas: {u} vs {units[0]}")
    gpus = [-1] * layout.size
    for p in range(layout.pp):
        for t in range(layout.tp):
            u = units[(p % kp) * kt + t % kt]
            gpus[p * layout.tp + t] = u.gpu_at(p // kp, t // kt)
    return Emu(units[0].model_stage, units[0].state, layout, tuple(gpus))


@dataclass(frozen=True)
class Split:
    source: Emu
    results: tuple[Emu, ...]
    plan: TransferPlan

    @property
    def bytes_moved(self) -> int:
        return self.plan.bytes_moved

    @property
    def bytes_min(self) -> int:
        return self.plan.bytes_min

    def blocks(self) -> tuple[tuple[int, ...], ...]:
        """GPU groups of the position-wise all-gather (GPUs sharing a new position)."""
        by_pos: dict[int, list[int]] = {}
        for unit in self.results:
            for pos, gpu in enumerate(unit.gpus):
                by_pos.setdefault(pos, []).append(gpu)
        return tuple(tuple(sorted(g)) for _, g in sorted(by_pos.items()))


@dataclass(frozen=True)
class Merge:
    sources: tuple[Emu, ...]
    result: Emu
    plan: TransferPlan

    @property
    def bytes_moved(self) -> int:
        return self.plan.bytes_moved

    @property
    def bytes_min(self) -> int:
        return self.plan.bytes_min


@dataclass(frozen=True)
class Extend:
    """A new replica ``result`` on fresh GPUs, read from the existing replicas ``sources``."""

    sources: tuple[Emu, ...]
    result: Emu
    plan: TransferPlan

    @property
    def bytes_moved(self) -> int:
        return self.plan.bytes_moved

    @property
    def bytes_min(self) -> int:
        return self.plan.bytes_min


@dataclass(frozen=True)
class Destroy:
    """Free ``unit``; ``survivors`` are the remaining replicas of its state (at least one)."""

    unit: Emu
    survivors: tuple[Emu, ...]
    bytes_moved: int = 0
    bytes_min: int = 0


def split(spec: ModelSpec, emu: Emu, sub: Layout, *, gpus_per_node: int = 8) -> Split:
    results = split_units(emu, sub)
    return Split(emu, results, plan_transfer(spec, [emu], results, gpus_per_node=gpus_per_node))


def merge(spec: ModelSpec, units: Sequence[Emu], layout: Layout, *,
          gpus_per_node: int = 8) -> Merge:
    result = merged_unit(units, layout)
    plan = plan_transfer(spec, list(units), [result], gpus_per_node=gpus_per_node)
    return Merge(tuple(units), result, plan)


def extend(spec: ModelSpec, replicas: Sequence[Emu], gpus: Sequence[int], *,
           gpus_per_node: int = 8) -> Extend:
    """Copy the state of ``replicas`` (same layout) onto ``gpus`` (disjoint, new)."""
    if not replicas:
        raise TransitionError("extend needs an existing replica")
    ref = replicas[0]
    used = {g for u in replicas for g in u.gpus}
    if used & set(gpus):
        raise TransitionError(f"extend onto GPUs already in use: {sorted(used & set(gpus))}")
    for u in replicas:
        if u.state != ref.state or u.layout != ref.layout:
            raise TransitionError(f"extend from non-replicas: {u} vs {ref}")
    result = Emu(ref.model_stage, ref.state, ref.layout, tuple(gpus))
    plan = plan_transfer(spec, list(replicas), [result], gpus_per_node=gpus_per_node)
    return Extend(tuple(replicas), result, plan)


def destroy(unit: Emu, replicas: Sequence[Emu]) -> Destroy:
    """Destroy ``unit``; refuses (TransitionError) unless another replica of its state survives."""
    survivors = tuple(u for u in replicas if u != unit and u.state == unit.state
                      and u.model_stage == unit.model_stage
                      and not set(u.gpus) & set(unit.gpus))
    if not survivors:
        raise TransitionError(
            f"refusing to destroy the last copy of {unit.model_stage}/{unit.state} on {unit.gpus}")
    return Destroy(unit, survivors)


def weight_sync(spec: ModelSpec, train_units: Sequence[Emu], gen_units: Sequence[Emu], *,
                gpus_per_node: int = 8) -> TransferPlan:
    """Parameters only (one field) from the actor-train units to the actor-gen units."""
    return plan_transfer(spec, list(train_units), list(gen_units), gpus_per_node=gpus_per_node,
                         fields=1)
