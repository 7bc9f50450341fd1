"""Run a transition DAG's primitives on the ranks of a job (effectful; DESIGN.md §2.3 item 3).

Every rank drives the same :class:`~nereus.transition.schedule.Scheduler` over the same DAG
(broadcast by rank 0) with a :class:`RankDagExecutor`. ``start`` only queues; ``wait`` runs the
queued primitives as one *wave*: per model-stage, its Split / Merge / Extend records run as one
pass (:meth:`nereus.runtime.execution.torch_executor.Executor.concurrent`: every peer pair's transfer posted at
once), the model-stages of a wave one after the other, then the wave's Destroys. The scheduler
only puts primitives on disjoint GPUs (or co-resident model-stages within memory) in one wave, so
the order inside a wave does not matter for the result; it is the scheduler's order on every
rank, which keeps the collective ``new_group`` calls of new units in step.

A DAG node (:mod:`nereus.transition.primitives`, analytic bytes) becomes an EMU record
(:mod:`nereus.emu.primitives`) whose transfer plan is the exact per-tensor one
(:func:`nereus.emu.transfer.plan_transfer`); bytes reported here are those exact bytes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch.distributed as dist

from nereus.emu import primitives as emu_prims
from nereus.emu.transfer import plan_transfer
from nereus.emu.unit import Emu
from nereus.errors import CommunicationError, TransitionError
from nereus.runtime.execution.torch_executor import Executor
from nereus.runtime.worker.state import FIELDS, UnitState
from nereus.spec.job import Setup
from nereus.transition import primitives as dag_prims
from nereus.transition.dag import TransitionDag
from nereus.transition.schedule import Scheduler, drive

TransferRecord = emu_prims.Split | emu_prims.Merge | emu_prims.Extend


def emu_record(setup: Setup, p: dag_prims.Primitive) -> TransferRecord | None:
    """The EMU record of DAG node ``p`` with its exact transfer plan (None for a Destroy)."""
    ms = setup.job.workflow.by_name(p.model_stage)
    spec = setup.job.model(ms.role)
    gpn = setup.cluster.gpus_per_node
    fields = len(FIELDS) if ms.trainable else 1
    if isinstance(p, dag_prims.Split):
        plan = plan_transfer(spec, [p.src], list(p.into), gpus_per_node=gpn, fields=fields)
        return emu_prims.Split(p.src, p.into, plan)
    if isinstance(p, dag_prims.Merge):
        plan = plan_transfer(spec, list(p.srcs), [p.into], gpus_per_node=gpn, fields=fields)
        return emu_prims.Merge(p.srcs, p.into, plan)
    if isinstance(p, dag_prims.Extend):
        plan = plan_transfer(spec, [p.src], [p.new], gpus_per_node=gpn, fields=fields)
        return emu_prims.Extend((p.src,), p.new, plan)
    return None


@dataclass(frozen=True)
class PrimitiveRun:
    index: int
    kind: str
    model_stage: str
    wave: int
    bytes_moved: int


@dataclass
class DagRun:
    """What one rank saw: primitives in completion order, waves, exact bytes, wall time."""

    primitives: list[PrimitiveRun] = field(default_factory=list)
    waves: int = 0
    seconds: float = 0.0

    @property
    def bytes_moved(self) -> int:
        return sum(p.bytes_moved for p in self.primitives)


class RankDagExecutor:
    """The scheduler's executor on one rank; ``held`` is this rank's units of ``dag.source``."""

    def __init__(self, setup: Setup, dag: TransitionDag, held: Mapping[Emu, UnitState],
                 global_rank: int, store: dist.Store, namespace: str, *, timeout_s: float,
                 lr: float) -> None:
        self.setup = setup
        self.global_rank = global_rank
        self.executors: dict[str, Executor] = {}
        for name in {u.model_stage for u in dag.source} | {u.model_stage for u in dag.target}:
            spec = setup.job.model(setup.job.workflow.by_name(name).role)
            self.executors[name] = Executor(spec, global_rank, store, f"{namespace}/{name}",
                                            timeout_s=timeout_s, lr=lr)
        for emu, st in held.items():
            if emu not in dag.source:
                raise TransitionError(f"rank {global_rank} holds {emu}, not a source of the DAG")
            self.executors[emu.model_stage].units[emu] = st
        self.live: set[Emu] = set(dag.source)  # every live unit of the job (all ranks)
        self.dropped: list[UnitState] = []  # this rank's states the DAG consumed
        self.run = DagRun()
        self._queued: list[tuple[int, dag_prims.Primitive]] = []

    def start(self, index: int, primitive: dag_prims.Primitive) -> None:
        self._queued.append((index, primitive))

    def wait(self) -> Sequence[int]:
        wave, self._queued = self._queued, []
        self.run.waves += 1
        by_stage: dict[str, list[tuple[int, TransferRecord]]] = {}
        destroys: list[tuple[int, dag_prims.Destroy]] = []
        for i, p in wave:
            if isinstance(p, dag_prims.Destroy):
                destroys.append((i, p))
                continue
            rec = emu_record(self.setup, p)
            assert rec is not None
            by_stage.setdefault(p.model_stage, []).append((i, rec))
        for name, recs in by_stage.items():
            ex = self.executors[name]
            before = dict(ex.units)
            try:
                ex.concurrent([r for _, r in recs])
            except (CommunicationError, TransitionError) as e:
                # where this rank was: on a hang every rank reports its own wave (the first
                # failure is not always the cause: a peer may be a wave ahead or behind)
                raise type(e)(f"wave {self.run.waves}, {name} primitives "
                              f"{[i for i, _ in recs]}: {e}") from e
            self.dropped += [st for e, st in before.items() if e not in ex.units]
            for i, rec in recs:
                self._account(i, rec)
        for i, d in destroys:
            ex = self.executors[d.model_stage]
            st = ex.units.get(d.unit)
            ex.destroy(emu_prims.destroy(d.unit, sorted(self.live)))  # never the last copy
            self.live.discard(d.unit)
            if st is not None:
                self.dropped.append(st)
            self.run.primitives.append(PrimitiveRun(i, "destroy", d.model_stage,
                                                    self.run.waves, 0))
        return [i for i, _ in wave]

    def _account(self, index: int, rec: TransferRecord) -> None:
        if isinstance(rec, emu_prims.Split):
            self.live.discard(rec.source)
            self.live.update(rec.results)
            kind = "split"
        elif isinstance(rec, emu_prims.Merge):
            self.live.difference_update(rec.sources)
            self.live.add(rec.result)
            kind = "merge"
        else:
            self.live.add(rec.result)
            kind = "extend"
        ms = rec.result.model_stage if not isinstance(rec, emu_prims.Split) \
            else rec.source.model_stage
        self.run.primitives.append(PrimitiveRun(index, kind, ms, self.run.waves,
                                                rec.plan.bytes_moved))

    def held(self) -> dict[Emu, UnitState]:
        return {e: st for ex in self.executors.values() for e, st in ex.units.items()}


def run_dag(setup: Setup, dag: TransitionDag, held: Mapping[Emu, UnitState], global_rank: int,
            store: dist.Store, namespace: str, *, timeout_s: float, lr: float
            ) -> tuple[dict[Emu, UnitState], list[UnitState], DagRun]:
    """Drive ``dag`` to its end on this rank (every rank calls it with the same DAG).

    Returns this rank's units of ``dag.target``, the states the DAG consumed (their groups are
    the caller's to release) and the run's record. Raises TransitionError when the scheduler
    stalls and CommunicationError when a transfer fails (the sources are then intact)."""
    ex = RankDagExecutor(setup, dag, held, global_rank, store, namespace, timeout_s=timeout_s,
                         lr=lr)
    t0 = time.perf_counter()
    drive(Scheduler(dag, capacity_bytes=setup.cluster.gpu.memory_bytes), ex)
    ex.run.seconds = time.perf_counter() - t0
    final = ex.held()
    target = set(dag.target)
    stray = [e for e in final if e not in target]
    if stray:
        raise TransitionError(f"rank {global_rank}: the DAG ended with units not in the target: "
                              f"{stray[:3]}")
    return final, ex.dropped, ex.run
