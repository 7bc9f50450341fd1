"""The trainers of a ``runtime.train_engine: deepspeed`` run as DeepSpeed ZeRO units (effectful).

A ZeRO model-stage (actor-train, critic-train) runs at tp = pp = 1 — the planner proposes only
that (``nereus.runtime.rank0.controller``: ``dp_only``) — and its DP replicas form one ZeRO unit
(:class:`nereus.engines.deepspeed_engine.ZeroUnit`): the parameters whole on every rank, the
fp32 master and Adam's moments partitioned over the unit's DP group by DeepSpeed (stage 1 or 2).

- :func:`build_zero_stage` builds a stage's units on the ranks (collective, in plan order):
  from a global logical state (the run's start, a gather-and-reload), or empty and filled by
  the live ZeRO re-partition from the running unit (a plan change that moved the stage's
  GPUs: :func:`nereus.runtime.execution.zero_executor.change_dp`).
- :func:`zero_pieces` reads a stage's global state (DeepSpeed's ``safe_get_full_*``, collective
  over the unit's DP group) for the gather paths (a plan change's gather-and-reload of the other
  stages does not need it; ``runtime.save_state`` does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from nereus.emu.unit import Emu
from nereus.engines.deepspeed_engine import MOMENTS, DeepSpeedOptions, ZeroUnit, build_zero_unit
from nereus.runtime.execution.groups import unit_groups
from nereus.runtime.worker.state import Counters, host_array
from nereus.spec.model import ModelSpec
from nereus.spec.plan import StagePlan


@dataclass
class ZeroSource:
    """A ZeRO stage of the running plan, handed to the next plan: its stage plan and this rank's
    unit (None where this rank holds none of it)."""

    plan: StagePlan
    unit: ZeroUnit | None
    groups: list[Any]  # the groups this rank joined for the stage


@dataclass(frozen=True)
class ZeroBuilt:
    """What :func:`build_zero_stage` made on this rank."""

    unit: tuple[int, ZeroUnit] | None  # (dp rank, unit) where this rank is in the stage
    groups: list[Any]  # every group this rank joined for it (to destroy with the plan)
    repartition: dict[str, Any] | None  # the live re-partition that filled it (log record)


def stage_gpus(sp: StagePlan) -> list[int]:
    """The stage's GPUs in DP-group order (tp = pp = 1: one GPU per replica)."""
    return sorted(g for rep in sp.replicas for g in rep)


def build_zero_stage(spec: ModelSpec, sp: StagePlan, emus: Sequence[Emu], rank: int,
                     options: DeepSpeedOptions, *, lr: float, timeout_s: float,
                     glob: Mapping[str, Mapping[str, np.ndarray]] | None,
                     counters: Counters, adam_step: float,
                     source: ZeroSource | None = None, store: Any = None,
                     name: str = "") -> ZeroBuilt:
    """Every rank: the groups of ``sp``'s units and its ZeRO unit where this rank is one of its
    GPUs. Filled from ``glob`` (field → tensor → global array) with ``counters`` and Adam step
    ``adam_step``, or — given ``source`` (collective over the job) — by the live re-partition
    from the running unit (``store``/``name``: its transfer group)."""
    groups: list[Any] = []
    mine: tuple[int, Emu, Any] | None = None
    for dp_rank, emu in enumerate(emus):
        g = unit_groups(emu, rank, timeout_s)
        if g is not None:
            mine = (dp_rank, emu, g)
            groups += [g.tp, g.pp, g.solo, g.embd, g.pos_embd]
    gpus = stage_gpus(sp)
    dp_group = dist.new_group(gpus, timeout=timedelta(seconds=timeout_s), backend="gloo")
    unit: ZeroUnit | None = None
    if mine is not None:
        groups.append(dp_group)
        dp_rank, emu, g = mine
        if source is not None:
            unit = build_zero_unit(spec, emu, rank, g, dp_group, gpus, options, lr=lr,
                                   initialize=False, counters=Counters())
        else:
            assert glob is not None
            unit = build_zero_unit(spec, emu, rank, g, dp_group, gpus, options, lr=lr,
                                   initialize=False, params=_params_of(spec, emu, glob),
                                   counters=Counters(**vars(counters)))
            _load_moments(unit, glob, adam_step)
    record = None
    if source is not None:
        from nereus.runtime.execution.zero_executor import change_dp

        change = change_dp(source.unit, unit, stage_gpus(source.plan), gpus, rank, store, name,
                           timeout_s=timeout_s)
        record = {"index": 0, "kind": "zero-repartition", "model_stage": sp.name, "wave": 0,
                  "bytes": change.plan.bytes_moved, "bytes_min": change.plan.bytes_min,
                  "dp": [len(stage_gpus(source.plan)), len(gpus)],
                  "transfer_s": change.transfer_s}
    return ZeroBuilt(None if unit is None or mine is None else (mine[0], unit), groups, record)


def _params_of(spec: ModelSpec, emu: Emu, glob: Mapping[str, Mapping[str, np.ndarray]]
               ) -> dict[str, np.ndarray]:
    """The model's parameters (by local key) from the global state: tp = pp = 1, whole."""
    from nereus.emu.shards import shards_at

    return {s.local_key: glob["param"][s.tensor] for s in shards_at(spec, emu.layout, 0, 0)}


def _load_moments(unit: ZeroUnit, glob: Mapping[str, Mapping[str, np.ndarray]],
                  adam_step: float) -> None:
    """Adam's step and moments into the unit's partitions by DeepSpeed's own API (each rank
    writes its fragment of every parameter)."""
    from deepspeed.utils import safe_set_full_optimizer_state

    unit.set_step(adam_step)  # creates Adam's state before DeepSpeed writes into it
    params = unit.params()
    for s in unit.shards():
        for key in MOMENTS:
            value = torch.from_numpy(np.ascontiguousarray(glob[key][s.tensor]))
            safe_set_full_optimizer_state(params[s.local_key], value, key)


def zero_pieces(unit: ZeroUnit, report: bool) -> list[tuple[str, str, tuple[int, ...],
                                                            tuple[int, ...], np.ndarray]]:
    """(field, tensor, global start, global stop, values) of the whole stage (collective over
    the unit's DP group: every DP rank calls it); only where ``report``, else []."""
    from deepspeed.utils import safe_get_full_optimizer_state

    unit.ensure_state()
    params = unit.params()
    out = []
    for s in unit.shards():
        p = params[s.local_key]
        full = {"param": p.data, **{k: safe_get_full_optimizer_state(p, k) for k in MOMENTS}}
        if not report:
            continue
        for f, t in full.items():
            for pc in s.pieces:
                view = t[tuple(slice(a, b) for a, b in zip(pc.local.start, pc.local.stop,
                                                            strict=True))]
                out.append((f, s.tensor, pc.global_.start, pc.global_.stop, host_array(view)))
    return out


def release_zero(unit: ZeroUnit | None, groups: Sequence[Any]) -> None:
    """Release a ZeRO unit DeepSpeed holds and destroy its groups (each once)."""
    if unit is not None:
        unit.destroy()
    seen: set[int] = set()
    for g in groups:
        if id(g) in seen or g is None or g == dist.GroupMember.NON_GROUP_MEMBER:
            continue
        seen.add(id(g))
        dist.destroy_process_group(g)
