"""The units of one execution plan on this rank: build, fill, gather, sync, tear down (effectful).

Every rank builds the process groups of every unit of the plan in plan order (``dist.new_group``
is collective), then the Megatron models of the units it belongs to, filled from a *global*
logical state (field → tensor name → array). Layout-independent by construction: the initial
state is drawn once at tp=1 (``initial_global``), or each rank reads its own shard of a Hugging
Face checkpoint (``fill_unit``). A later plan adopts the units a transition DAG
left on this rank (``adopted``: :mod:`nereus.runtime.execution.plan_change`), or — the fallback — is
installed from the state gathered out of the running one (:mod:`nereus.runtime.execution.gather_reload`). DP replicas of a
trainable model-stage all-reduce gradients over one gloo group per (pp, tp) position. The
per-step weight sync (actor-train → actor-gen, critic-train → critic-inf) runs through the EMU
transfer machinery (``nereus.runtime.execution.torch_executor.TorchExecutor.weight_sync``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from nereus.emu.shards import shards_at, tensor_specs
from nereus.emu.transfer import weight_sync_plan
from nereus.emu.unit import Emu, Layout
from nereus.engines.generation import enable_kv_cache
from nereus.engines.megatron_model import StageGroups, build_gpt
from nereus.errors import TransitionError
from nereus.runtime.execution.device import RankDevice
from nereus.runtime.execution.groups import unit_groups
from nereus.runtime.execution.torch_executor import TorchExecutor
from nereus.runtime.worker.state import (
    FIELDS,
    Counters,
    UnitState,
    host_array,
    load_global,
    new_unit_state,
)
from nereus.spec.job import Setup
from nereus.spec.model import ModelSpec
from nereus.spec.plan import ExecutionPlan, StagePlan

if TYPE_CHECKING:
    from nereus.engines.deepspeed_engine import DeepSpeedOptions
    from nereus.runtime.worker.zero_units import ZeroSource

Glob = dict[str, dict[str, np.ndarray]]  # field → tensor → global array
# Which trained model-stage feeds which frozen copy every step.
SYNCS = (("actor-train", "actor-gen"), ("critic-train", "critic-inf"))


def spec_of(setup: Setup, model_stage: str) -> ModelSpec:
    return setup.job.model(setup.job.workflow.by_name(model_stage).role)


def stage_emus(sp: StagePlan) -> tuple[Emu, ...]:
    return tuple(Emu(sp.name, sp.name, Layout(sp.tp, sp.pp), tuple(r)) for r in sp.replicas)


@dataclass
class StageUnits:
    plan: StagePlan
    emus: tuple[Emu, ...]
    mine: dict[int, UnitState] = field(default_factory=dict)  # dp_rank → this rank's state
    dp_group: Any = None  # the DP group of this rank's (pp, tp) position (trainable stages)

    def my_replica(self) -> tuple[int, UnitState] | None:
        return next(iter(self.mine.items()), None)


def _groups_of(g: StageGroups) -> list[Any]:
    return [g.tp, g.pp, g.solo, g.embd, g.pos_embd]


class PlanUnits:
    """Everything this rank holds for ``plan``; ``destroy`` releases its groups and tensors."""

    def __init__(self, setup: Setup, plan: ExecutionPlan, global_rank: int, timeout_s: float,
                 lr: float, globs: dict[str, Glob], counters: dict[str, tuple[Counters, float]],
                 store: dist.Store, namespace: str,
                 adopted: Mapping[Emu, UnitState] | None = None,
                 device: RankDevice | None = None,
                 local: Mapping[Emu, LocalCopy] | None = None,
                 zero: DeepSpeedOptions | None = None, zero_names: tuple[str, ...] = (),
                 zero_sources: Mapping[str, ZeroSource] | None = None,
                 kept_dp: Mapping[str, Any] | None = None,
                 rebuilt: Collection[str] = ()) -> None:
        """Build the plan's units from ``globs``/``counters``, or — when ``adopted`` is given
        (after a transition DAG, on every rank) — take this rank's units of the plan from it:
        then no unit group is created (the DAG made them), only the DP groups. ``device``: this
        rank's device and every rank's placement (None: CPU ranks). ``local``: this rank's own
        shards of its units (:func:`local_copy`), loaded instead of ``globs`` (a growth: the
        old ranks' units rebuilt on the grown job's groups). ``zero_names``: the
        model-stages that run as DeepSpeed ZeRO units with ``zero``
        (:mod:`nereus.runtime.worker.zero_units`); ``zero_sources``: the running plan's,
        kept where the stage plan is the same, else re-partitioned live into the new one.
        ``kept_dp``: the DP groups of the running plan's model-stages whose replicas the plan
        keeps (:meth:`handover_dp`; None on ranks outside them), adopted instead of created.
        ``rebuilt``: frozen copies the transition left no unit of (every replica was lost, their
        trained source kept one: :mod:`nereus.transition.rebuild`), built here and filled by
        the weight sync from their source's units (``rebuilt_bytes``: what that moved)."""
        self.device = device
        self.setup = setup
        self.plan = plan
        self.global_rank = global_rank
        self.timeout_s = timeout_s
        self.stages: dict[str, StageUnits] = {}
        self._groups: list[Any] = []
        self._store = store
        self._namespace = namespace
        self._sync_seq = 0
        self.sync_transports: dict[str, int] = {}  # the last weight sync's groups, by transport
        self.zero, self.zero_names = zero, zero_names
        self._zero_groups: dict[str, list[Any]] = {}
        self.repartitions: list[dict[str, Any]] = []  # live ZeRO re-partitions that filled units
        to = timedelta(seconds=timeout_s)
        for sp in plan.stages:
            su = StageUnits(sp, stage_emus(sp))
            spec = spec_of(setup, sp.name)
            c, adam_step = counters.get(sp.name, (Counters(), 0.0))
            if sp.name in zero_names:
                self._zero_stage(su, spec, lr, globs, c, adam_step,
                                 (zero_sources or {}).get(sp.name))
                self.stages[sp.name] = su
                continue
            for dp_rank, emu in enumerate(su.emus):
                if adopted is not None and sp.name not in rebuilt:
                    if global_rank not in emu.gpus:
                        continue
                    if emu not in adopted:
                        raise TransitionError(
                            f"rank {global_rank}: the transition left no state for {emu}")
                    st = adopted[emu]
                    self._groups += _groups_of(st.groups)
                    enable_kv_cache(st.model, st.groups.tp)
                    su.mine[dp_rank] = st
                    continue
                groups = unit_groups(emu, global_rank, timeout_s, device)
                if groups is None:
                    continue
                self._groups += _groups_of(groups)
                if sp.name in rebuilt:  # its values come from the weight sync below
                    st = new_unit_state(spec, emu, global_rank, groups, lr=lr, device=device)
                    enable_kv_cache(st.model, groups.tp)
                    su.mine[dp_rank] = st
                    continue
                # on a GPU the values come from the logical state alone (load_global below)
                if local is not None:
                    values, (lc, adam) = local[emu]
                    st = new_unit_state(spec, emu, global_rank, groups, lr=lr, step=adam,
                                        counters=Counters(**vars(lc)), device=device,
                                        initialize=False)
                    load_local(st, values)
                    enable_kv_cache(st.model, groups.tp)
                    su.mine[dp_rank] = st
                    continue
                source = globs[sp.name]
                st = new_unit_state(spec, emu, global_rank, groups, lr=lr, step=adam_step,
                                    counters=Counters(**vars(c)), device=device,
                                    initialize=isinstance(source, dict) and (
                                        device is None or not device.on_gpu))
                fill_unit(st, source)
                enable_kv_cache(st.model, groups.tp)
                su.mine[dp_rank] = st
            if kept_dp is not None and sp.name in kept_dp:  # the same ranks: the same groups
                su.dp_group = kept_dp[sp.name]
                if su.dp_group is not None:
                    self._groups.append(su.dp_group)
            elif setup.job.workflow.by_name(sp.name).trainable and sp.dp > 1:
                for pos in range(sp.tp * sp.pp):
                    ranks = sorted(rep[pos] for rep in sp.replicas)
                    g = dist.new_group(ranks, timeout=to, backend="gloo" if device is None
                                       else device.backend(ranks))
                    if global_rank in ranks:
                        su.dp_group = g
                        self._groups.append(g)
            self.stages[sp.name] = su
        self.rebuilt_bytes = self.sync_weights(only=rebuilt) if rebuilt else 0

    def _zero_stage(self, su: StageUnits, spec: ModelSpec, lr: float, globs: dict[str, Glob],
                    c: Counters, adam_step: float, source: ZeroSource | None) -> None:
        """A ZeRO stage: kept from ``source`` when its GPUs are unchanged (a new micro-batch
        size needs nothing moved), re-partitioned live from it when not, else built from the
        global state."""
        from nereus.runtime.worker.zero_units import build_zero_stage, release_zero

        sp = su.plan
        if source is not None and source.plan.replicas == sp.replicas:
            if source.unit is not None:
                at = sp.replicas.index(tuple(source.unit.emu.gpus))
                su.mine[at] = source.unit  # type: ignore[assignment]
                su.dp_group = source.unit.dp_group
            self._zero_groups[sp.name] = list(source.groups)
            return
        assert self.zero is not None
        glob = globs.get(sp.name)
        if glob is not None and not isinstance(glob, dict):  # a checkpoint: tp = pp = 1 here
            glob = glob.whole()
        built = build_zero_stage(spec, sp, su.emus, self.global_rank, self.zero, lr=lr,
                                 timeout_s=self.timeout_s, glob=glob,
                                 counters=c, adam_step=adam_step, source=source,
                                 store=self._store, name=f"{self._namespace}/zero/{sp.name}")
        if source is not None:
            release_zero(source.unit, source.groups)
        if built.unit is not None:
            su.mine[built.unit[0]] = built.unit[1]  # type: ignore[assignment]
            su.dp_group = built.unit[1].dp_group
        self._zero_groups[sp.name] = built.groups
        if built.repartition is not None:
            self.repartitions.append(built.repartition)

    def handover_zero(self) -> dict[str, ZeroSource]:
        """The ZeRO stages, given away to the next plan (:meth:`destroy` then leaves them)."""
        from nereus.runtime.worker.zero_units import ZeroSource

        out = {}
        for name, groups in self._zero_groups.items():
            su = self.stages[name]
            mine = su.my_replica()
            out[name] = ZeroSource(su.plan, None if mine is None else mine[1],  # type: ignore
                                   groups)
            su.mine.clear()
        self._zero_groups = {}
        return out

    def units(self) -> list[UnitState]:
        return [st for su in self.stages.values() for st in su.mine.values()]

    def sync_weights(self, only: Collection[str] | None = None) -> int:
        """Copy parameters of every trained model-stage into its frozen copy (EMU transfer
        plan, one field), or into the copies in ``only``; returns the bytes this plan moves
        between ranks."""
        moved = 0
        self.sync_transports = {}
        for src, dst in SYNCS:
            if src not in self.stages or dst not in self.stages:
                continue
            if only is not None and dst not in only:
                continue
            spec = spec_of(self.setup, src)
            s_units, d_units = self.stages[src], self.stages[dst]
            plan = weight_sync_plan(spec, s_units.emus, d_units.emus,
                                    gpus_per_node=self.setup.cluster.gpus_per_node)
            self._sync_seq += 1
            ex = TorchExecutor(spec, self.global_rank, self._store,
                               f"{self._namespace}/sync{self._sync_seq}/{dst}", fields=1,
                               timeout_s=self.timeout_s, device=self.device)
            for su in (s_units, d_units):
                for dp_rank, st in su.mine.items():
                    ex.units[su.emus[dp_rank]] = st
            ex.weight_sync(plan)
            for name, n in ex.transports.items():
                self.sync_transports[name] = self.sync_transports.get(name, 0) + n
            moved += plan.bytes_moved
        return moved

    def handover(self) -> dict[Emu, UnitState]:
        """This rank's units, given away to a transition: afterwards :meth:`destroy` releases
        only the DP groups (the units' own groups go with the units)."""
        held = {su.emus[dp_rank]: st for su in self.stages.values()
                for dp_rank, st in su.mine.items()}
        unit_groups_ = {id(g) for st in held.values() for g in _groups_of(st.groups)}
        self._groups = [g for g in self._groups if id(g) not in unit_groups_]
        for su in self.stages.values():
            su.mine.clear()
        return held

    def handover_dp(self, target: ExecutionPlan) -> dict[str, Any]:
        """The DP groups of the model-stages whose replicas (and layout) ``target`` keeps, given
        away to the plan that follows (name → this rank's group, None where it is in none):
        afterwards :meth:`destroy` leaves them. Every rank decides from the two plans alone,
        so every rank skips the same ``dist.new_group`` calls (they are collective)."""
        out: dict[str, Any] = {}
        for sp in target.stages:
            su = self.stages.get(sp.name)
            if su is None or sp.name in self.zero_names or not (
                    su.plan.replicas == sp.replicas and (su.plan.tp, su.plan.pp) == (sp.tp, sp.pp)
                    and self.setup.job.workflow.by_name(sp.name).trainable and sp.dp > 1):
                continue
            out[sp.name] = su.dp_group
            su.dp_group = None
        kept = {id(g) for g in out.values() if g is not None}
        self._groups = [g for g in self._groups if id(g) not in kept]
        return out

    def destroy(self) -> None:
        """Drop models and optimizer state, destroy every group this rank joined."""
        if self._zero_groups:  # imported only then: the import took 0.04-0.1 s of a change
            from nereus.runtime.worker.zero_units import release_zero

            for name, groups in self._zero_groups.items():
                mine = self.stages[name].my_replica()
                release_zero(None if mine is None else mine[1], groups)  # type: ignore[arg-type]
        self._zero_groups = {}
        for su in self.stages.values():
            su.mine.clear()
        seen: set[int] = set()
        for g in self._groups:
            if id(g) in seen or g is None or g == dist.GroupMember.NON_GROUP_MEMBER:
                continue
            seen.add(id(g))
            dist.destroy_process_group(g)
        self._groups.clear()


def release_units(states: list[UnitState]) -> None:
    """Destroy the process groups of units this rank no longer holds (each group once)."""
    seen: set[int] = set()
    for st in states:
        for g in _groups_of(st.groups):
            if id(g) in seen or g is None or g == dist.GroupMember.NON_GROUP_MEMBER:
                continue
            seen.add(id(g))
            dist.destroy_process_group(g)


def fill_unit(st: UnitState, source: Any) -> None:
    """Fill this rank's shard of a unit from a global logical state (``Glob``) or from a
    source that writes shards itself (a Hugging Face checkpoint read by slices:
    :class:`nereus.hf.load.CheckpointSource`)."""
    if isinstance(source, dict):
        load_global(st, source)
    else:
        source.fill(st)


def initial_global(spec: ModelSpec, seed: int, solo: StageGroups) -> Glob:
    """The initial logical state of ``spec``: Megatron's draws of a tp=1 model from ``seed``
    (so every layout starts from the same state), Adam moments zero."""
    model = build_gpt(spec, 1, 1, 0, solo, seed=seed)
    params = dict(model.named_parameters())
    glob: Glob = {f: {} for f in FIELDS}
    for s in shards_at(spec, Layout(1, 1), 0, 0):
        arr = params[s.local_key].detach().clone().numpy()
        glob["param"][s.tensor] = arr
        glob["exp_avg"][s.tensor] = np.zeros_like(arr)
        glob["exp_avg_sq"][s.tensor] = np.zeros_like(arr)
    return glob


def local_pieces(st: UnitState, fields: tuple[str, ...]) -> list[tuple[str, str, tuple[int, ...],
                                                                        tuple[int, ...],
                                                                        np.ndarray]]:
    """(field, tensor, global start, global stop, values) of this rank's distinct shards."""
    live = st.tensors()
    out = []
    for s in st.shards():
        if s.tp_replica:
            continue
        for f in fields:
            if f not in live:  # a ZeRO unit: its moments are partitions (zero_units.zero_pieces)
                continue
            t = live[f][s.local_key]
            for pc in s.pieces:
                view = t[tuple(slice(a, b) for a, b in zip(pc.local.start, pc.local.stop,
                                                            strict=True))]
                out.append((f, s.tensor, pc.global_.start, pc.global_.stop, host_array(view)))
    return out


def assemble_global(spec: ModelSpec, pieces: list[Any]) -> Glob:
    """Global arrays from the pieces of one replica (missing fields are zero)."""
    shapes = {t.name: t.global_shape for t in tensor_specs(spec)}
    glob: Glob = {f: {n: np.zeros(shp, dtype=np.float32) for n, shp in shapes.items()}
                  for f in FIELDS}
    for f, tensor, start, stop, arr in pieces:
        glob[f][tensor][tuple(slice(a, b) for a, b in zip(start, stop, strict=True))] = arr
    return glob


# this rank's values of one unit (field -> local key -> array) and its counters
LocalCopy = tuple[dict[str, dict[str, np.ndarray]], tuple[Counters, float]]


def local_copy(st: UnitState) -> LocalCopy:
    """A host copy of this rank's shards of a unit and its counters (no communication)."""
    return st.snapshot(), counters_of(st)


def load_local(st: UnitState, values: dict[str, dict[str, np.ndarray]]) -> None:
    """Write a :func:`local_copy` back into a unit of the same EMU on this rank."""
    live = st.tensors()
    for f, d in values.items():
        for k, arr in d.items():
            live[f][k].copy_(torch.from_numpy(arr))
    st.refresh_model()


def counters_of(st: UnitState) -> tuple[Counters, float]:
    return Counters(**vars(st.counters)), st.step_value()


def zero_grads(st: UnitState) -> None:
    st.optimizer.zero_grad(set_to_none=True)


def allreduce_grads(st: UnitState, group: Any) -> None:
    """Sum gradients over the DP group (the losses are already normalized globally)."""
    if group is None:
        return
    grads = st.grads()  # fp32 (the masters') under mixed precision
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    if flat.device.type != "cpu" and dist.get_backend(group) == "gloo":  # host transport
        host = flat.cpu()
        dist.all_reduce(host, group=group)
        flat.copy_(host)
    else:
        dist.all_reduce(flat, group=group)
    off = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[off:off + n].view_as(g))
        off += n
