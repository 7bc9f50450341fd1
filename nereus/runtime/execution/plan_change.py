"""Apply a plan change on every rank at a step boundary (effectful; DESIGN.md §2.1, §2.3).

Rank 0 planned the transition once (:mod:`nereus.runtime.rank0.loop`) and sent it to every rank
with the target plan, in one :class:`~nereus.runtime.rank0.loop.PlanChangeOrder`. Every rank runs
its DAG's primitives (:func:`nereus.runtime.execution.dag.run_dag`): units that survive the
change keep their tensors (and groups), new ones receive exactly the bytes whose owner changes;
the DP groups of every model-stage whose replicas stay are kept too, so a change of batch split
only (a DAG without primitives) creates no process group at all. Frozen copies whose every
replica left the pool while their trained source kept one (``order.rebuilt``) are built after
the DAG and filled by the weight sync from the source's new units. When the
order stages some model-stages through host memory (no order of the plain DAG fits device
memory), every rank runs the three legs of :mod:`nereus.runtime.execution.host_stage`. When no
DAG exists — every replica of some model-stage sat on removed ranks — the order says why
instead and every rank takes the in-process gather+reload path
(:mod:`nereus.runtime.execution.gather_reload`); the log records which executor ran and why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from nereus.runtime.execution.dag import run_dag
from nereus.runtime.execution.gather_reload import gather_state, state_bytes
from nereus.runtime.execution.host_stage import run_staged
from nereus.runtime.worker.units import PlanUnits, release_units
from nereus.transition.order import PlanChangeOrder

EXECUTORS = ("dag", "staged", "gather-reload", "zero-repartition")


@dataclass(frozen=True)
class PlanChange:
    """What ran: ``executor`` one of :data:`EXECUTORS`; ``reason`` why the DAG was not used."""

    executor: str
    bytes_moved: int
    reason: str = ""
    waves: int = 0
    primitives: list[dict[str, Any]] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    transports: dict[str, int] = field(default_factory=dict)  # this rank's transfer groups
    host_bytes: int = 0  # what this rank parked in host memory (a staged change)
    phases_s: dict[str, float] = field(default_factory=dict)  # this rank's seconds per phase


def change_plan(comm: Any, units: PlanUnits, order: PlanChangeOrder, store: dist.Store,
                version: int, *, lr: float) -> tuple[PlanUnits, PlanChange]:
    """Every rank: leave ``units`` (consumed) for the units of ``order.target``, by the order's
    DAG, or by gathering and reloading the state where it has none."""
    setup, rank, timeout_s = units.setup, units.global_rank, units.timeout_s
    device = units.device
    target, namespace = order.target, f"p{version}"
    dag = order.dag
    if units.zero_names:
        return _change_with_zero(comm, units, order, store, version, lr=lr)
    if order.staged is not None:
        return _change_staged(units, order, store, namespace, lr=lr)
    if dag is None:
        t0 = time.perf_counter()
        globs, counters, lost = gather_state(units, comm, order.pool)
        t1 = time.perf_counter()
        units.destroy()
        if device is not None:
            device.release_memory()
        t2 = time.perf_counter()
        new = PlanUnits(setup, target, rank, timeout_s, lr, globs, counters, store, namespace,
                        device=device)
        phases = {"gather": t1 - t0, "release": t2 - t1, "build": time.perf_counter() - t2}
        return new, PlanChange("gather-reload", state_bytes(globs), order.reason, lost=lost,
                               transports={"mpi": 1}, phases_s=phases)
    held, kept_dp = units.handover(), units.handover_dp(target)
    units.destroy()  # the changed DP groups; the units' own groups travel with them
    sources = set(dag.source)
    stale = [st for e, st in held.items() if e not in sources]  # on ranks that left the pool
    final, consumed, run = run_dag(setup, dag, {e: st for e, st in held.items() if e in sources},
                                   rank, store, f"{namespace}/dag", timeout_s=timeout_s, lr=lr,
                                   device=device)
    release_units(stale + consumed)
    del stale, consumed, held
    if device is not None:
        device.release_memory()  # what the DAG dropped goes back to the device
    new = PlanUnits(setup, target, rank, timeout_s, lr, {}, {}, store, namespace, adopted=final,
                    device=device, kept_dp=kept_dp, rebuilt=order.rebuilt)
    prims = [{"index": p.index, "kind": p.kind, "model_stage": p.model_stage, "wave": p.wave,
              "bytes": p.bytes_moved} for p in run.primitives]
    return new, PlanChange("dag", run.bytes_moved + new.rebuilt_bytes, rebuilt_reason(order),
                           waves=run.waves, primitives=prims, transports=run.transports)


def rebuilt_reason(order: PlanChangeOrder) -> str:
    """What the log says of the frozen copies the change rebuilt from their sources."""
    if not order.rebuilt:
        return order.reason
    why = f"{', '.join(order.rebuilt)} lost every replica: rebuilt from the trained source"
    return f"{order.reason}; {why}" if order.reason else why


def _change_staged(units: PlanUnits, order: PlanChangeOrder, store: dist.Store,
                   namespace: str, *, lr: float) -> tuple[PlanUnits, PlanChange]:
    """The host-staged change (:mod:`nereus.runtime.execution.host_stage`): the staged
    model-stages parked in host memory around the DAG of the others."""
    setup, rank, timeout_s, device = units.setup, units.global_rank, units.timeout_s, units.device
    staged = order.staged
    assert staged is not None
    held, kept_dp = units.handover(), units.handover_dp(order.target)
    units.destroy()  # the changed DP groups; the units' own groups travel with them
    sources = set(staged.rest.dag.source) | {e for h in staged.stages
                                             for e in (h.source, *h.dropped)}
    stale = [st for e, st in held.items() if e not in sources]  # on ranks that left the pool
    mine = {e: st for e, st in held.items() if e in sources}
    del held
    final, consumed, run = run_staged(setup, staged, mine, rank, store, f"{namespace}/staged",
                                      timeout_s=timeout_s, lr=lr, device=device)
    release_units(stale + consumed)
    del stale, consumed, mine
    if device is not None:
        device.release_memory()
    new = PlanUnits(setup, order.target, rank, timeout_s, lr, {}, {}, store, namespace,
                    adopted=final, device=device, kept_dp=kept_dp, rebuilt=order.rebuilt)
    prims = [{"index": p.index, "kind": p.kind, "model_stage": p.model_stage, "wave": p.wave,
              "bytes": p.bytes_moved} for p in run.dag.primitives]
    return new, PlanChange("staged", run.dag.bytes_moved + new.rebuilt_bytes,
                           rebuilt_reason(order), waves=run.dag.waves,
                           primitives=prims, transports=run.dag.transports,
                           host_bytes=run.host_bytes)


def _change_with_zero(comm: Any, units: PlanUnits, order: PlanChangeOrder, store: dist.Store,
                      version: int, *, lr: float) -> tuple[PlanUnits, PlanChange]:
    """A plan change of a run whose trainers are DeepSpeed ZeRO units
    (``runtime.train_engine: deepspeed``): a ZeRO stage whose GPUs changed is re-partitioned
    live (:mod:`nereus.runtime.execution.zero_executor`: DeepSpeed's partition metadata, each
    element sent once), an unchanged one kept; the other model-stages go the gather-and-reload
    path (the transition DAG's EMU primitives do not hold ZeRO partitions)."""
    setup, rank, timeout_s = units.setup, units.global_rank, units.timeout_s
    globs, counters, lost = gather_state(units, comm, order.pool, skip=units.zero_names)
    sources = units.handover_zero()
    zero, names = units.zero, units.zero_names
    units.destroy()
    new = PlanUnits(setup, order.target, rank, timeout_s, lr, globs, counters, store,
                    f"p{version}", device=units.device, zero=zero, zero_names=names,
                    zero_sources=sources)
    moved = state_bytes(globs) + sum(int(r["bytes"]) for r in new.repartitions)
    executor = "zero-repartition" if new.repartitions else "gather-reload"
    reason = ("the DeepSpeed engine's plan changes: ZeRO stages re-partitioned live, the "
              "other model-stages gathered and reloaded")
    return new, PlanChange(executor, moved, reason, waves=1 if new.repartitions else 0,
                           primitives=list(new.repartitions), lost=lost,
                           transports={"mpi": 1})
