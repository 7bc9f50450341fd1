"""Apply a plan change on every rank at a step boundary (effectful; DESIGN.md §2.1, §2.3).

Rank 0 compiles the transition DAG from the units of the running plan that survive on the new
pool to the target plan (pure core, :func:`nereus.control.planner_port.compile_dag`) and
broadcasts it as plain data; every rank then runs its primitives
(:func:`nereus.runtime.execution.dag.run_dag`): units that survive the change keep their
tensors, new ones receive exactly the bytes whose owner changes. When no DAG exists — every
replica of some model-stage sat on removed ranks, or no order fits memory — rank 0 broadcasts
the reason instead and every rank takes the in-process gather+reload path
(:mod:`nereus.runtime.execution.gather_reload`); the log records which executor ran and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from nereus.errors import InfeasiblePlanError, TransitionError
from nereus.runtime.execution.dag import run_dag
from nereus.runtime.execution.gather_reload import gather_state, state_bytes
from nereus.runtime.mpi.plane import Message
from nereus.runtime.worker.units import PlanUnits, release_units
from nereus.spec.plan import ExecutionPlan
from nereus.transition.wire import dag_from_wire, dag_to_wire

EXECUTORS = ("dag", "gather-reload")


@dataclass(frozen=True)
class PlanChange:
    """What ran: ``executor`` one of :data:`EXECUTORS`; ``reason`` why the DAG was not used."""

    executor: str
    bytes_moved: int
    reason: str = ""
    waves: int = 0
    primitives: list[dict[str, Any]] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


def root_dag(units: PlanUnits, target: ExecutionPlan, pool: Sequence[int]
             ) -> tuple[dict[str, Any] | None, str]:
    """(the DAG on the wire, "") or (None, why not) — rank 0 only."""
    from nereus.control.planner_port import compile_dag

    try:
        return dag_to_wire(compile_dag(units.setup, units.plan, target, pool)), ""
    except (TransitionError, InfeasiblePlanError) as e:
        return None, str(e)


def change_plan(plane: Any, comm: Any, units: PlanUnits, target: ExecutionPlan,
                pool: Sequence[int], store: dist.Store, version: int, *, lr: float,
                executor: str = "dag") -> tuple[PlanUnits, PlanChange]:
    """Every rank: leave ``units`` (consumed) for the units of ``target``."""
    wire: dict[str, Any] | None = None
    reason = "runtime.transition_executor is gather-reload"
    if plane.is_root and executor == "dag":
        wire, reason = root_dag(units, target, pool)
    msg = plane.broadcast(Message("dag", plane.next_seq(), {"dag": wire, "reason": reason})
                          if plane.is_root else None)
    setup, rank, timeout_s = units.setup, units.global_rank, units.timeout_s
    namespace = f"p{version}"
    if msg.payload["dag"] is None:
        globs, counters, lost = gather_state(units, comm, pool)
        units.destroy()
        new = PlanUnits(setup, target, rank, timeout_s, lr, globs, counters, store, namespace)
        return new, PlanChange("gather-reload", state_bytes(globs), str(msg.payload["reason"]),
                               lost=lost)
    dag = dag_from_wire(msg.payload["dag"])
    held = units.handover()
    units.destroy()  # the DP groups; the units' own groups travel with them
    sources = set(dag.source)
    stale = [st for e, st in held.items() if e not in sources]  # on ranks that left the pool
    final, consumed, run = run_dag(setup, dag, {e: st for e, st in held.items() if e in sources},
                                   rank, store, f"{namespace}/dag", timeout_s=timeout_s, lr=lr)
    release_units(stale + consumed)
    new = PlanUnits(setup, target, rank, timeout_s, lr, {}, {}, store, namespace, adopted=final)
    prims = [{"index": p.index, "kind": p.kind, "model_stage": p.model_stage, "wave": p.wave,
              "bytes": p.bytes_moved} for p in run.primitives]
    return new, PlanChange("dag", run.bytes_moved, waves=run.waves, primitives=prims)
