"""Run a transition DAG's primitives on the ranks of a job (effectful; DESIGN.md §2.3 item 3).

Every rank drives the same :class:`~nereus.transition.schedule.Scheduler` over the same DAG
(broadcast by rank 0 with the target plan) with a :class:`RankDagExecutor`. ``start`` only
queues; ``wait`` runs the queued primitives as one *wave*: per model-stage, its Split / Merge /
Extend nodes run as one pass
(:meth:`nereus.runtime.execution.torch_executor.TorchExecutor.concurrent`: every peer pair's
transfer posted at once), the model-stages of a wave one after the other, then the wave's
Destroys. The scheduler only puts primitives on disjoint GPUs (or co-resident model-stages
within memory) in one wave, so the order inside a wave does not matter for the result; it is
the scheduler's order on every rank, which keeps the collective ``new_group`` calls of new units
in step.

The DAG's nodes are what the torch executor runs: each computes its exact per-tensor transfer
plan from the node and the shard rules (:func:`nereus.emu.transfer.node_transfer`); bytes
reported here are those exact bytes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch.distributed as dist

from nereus.emu.primitives import Destroy, Primitive, TransferNode, consumed, produced
from nereus.emu.unit import Emu
from nereus.errors import CommunicationError, TransitionError
from nereus.runtime.execution.device import RankDevice
from nereus.runtime.execution.torch_executor import TorchExecutor
from nereus.runtime.worker.state import FIELDS, UnitState
from nereus.spec.job import Setup
from nereus.transition.dag import TransitionDag
from nereus.transition.schedule import Scheduler, drive


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
    transports: dict[str, int] = field(default_factory=dict)  # transfer groups by transport

    @property
    def bytes_moved(self) -> int:
        return sum(p.bytes_moved for p in self.primitives)


class RankDagExecutor:
    """The scheduler's executor on one rank; ``held`` is this rank's units of ``dag.source``."""

    def __init__(self, setup: Setup, dag: TransitionDag, held: Mapping[Emu, UnitState],
                 global_rank: int, store: dist.Store, namespace: str, *, timeout_s: float,
                 lr: float, device: RankDevice | None = None) -> None:
        self.setup = setup
        self.global_rank = global_rank
        self.executors: dict[str, TorchExecutor] = {}
        for name in {u.model_stage for u in dag.source} | {u.model_stage for u in dag.target}:
            ms = setup.job.workflow.by_name(name)
            self.executors[name] = TorchExecutor(
                setup.job.model(ms.role), global_rank, store, f"{namespace}/{name}",
                fields=len(FIELDS) if ms.trainable else 1,
                gpus_per_node=setup.cluster.gpus_per_node, timeout_s=timeout_s, lr=lr,
                device=device)
        for emu, st in held.items():
            if emu not in dag.source:
                raise TransitionError(f"rank {global_rank} holds {emu}, not a source of the DAG")
            self.executors[emu.model_stage].units[emu] = st
        self.live: set[Emu] = set(dag.source)  # every live unit of the job (all ranks)
        self.dropped: list[UnitState] = []  # this rank's states the DAG consumed
        self.run = DagRun()
        self._queued: list[tuple[int, Primitive]] = []

    def start(self, index: int, primitive: Primitive) -> None:
        self._queued.append((index, primitive))

    def wait(self) -> Sequence[int]:
        wave, self._queued = self._queued, []
        self.run.waves += 1
        by_stage: dict[str, list[tuple[int, TransferNode]]] = {}
        destroys: list[tuple[int, Destroy]] = []
        for i, p in wave:
            if isinstance(p, Destroy):
                destroys.append((i, p))
            else:
                by_stage.setdefault(p.model_stage, []).append((i, p))
        for name, nodes in by_stage.items():
            ex = self.executors[name]
            before = dict(ex.units)
            try:
                plans = ex.concurrent([p for _, p in nodes])
            except (CommunicationError, TransitionError) as e:
                # where this rank was: on a hang every rank reports its own wave (the first
                # failure is not always the cause: a peer may be a wave ahead or behind)
                raise type(e)(f"wave {self.run.waves}, {name} primitives "
                              f"{[i for i, _ in nodes]}: {e}") from e
            self.dropped += [st for e, st in before.items() if e not in ex.units]
            for (i, p), plan in zip(nodes, plans, strict=True):
                self.live.difference_update(consumed(p))
                self.live.update(produced(p))
                self.run.primitives.append(PrimitiveRun(i, type(p).__name__.lower(),
                                                        p.model_stage, self.run.waves,
                                                        plan.bytes_moved))
        for i, d in destroys:
            ex = self.executors[d.model_stage]
            st = ex.units.get(d.unit)
            ex.destroy(d, self.live)  # never the last copy
            self.live.discard(d.unit)
            if st is not None:
                self.dropped.append(st)
            self.run.primitives.append(PrimitiveRun(i, "destroy", d.model_stage,
                                                    self.run.waves, 0))
        return [i for i, _ in wave]

    def held(self) -> dict[Emu, UnitState]:
        return {e: st for ex in self.executors.values() for e, st in ex.units.items()}


def run_dag(setup: Setup, dag: TransitionDag, held: Mapping[Emu, UnitState], global_rank: int,
            store: dist.Store, namespace: str, *, timeout_s: float, lr: float,
            device: RankDevice | None = None
            ) -> tuple[dict[Emu, UnitState], list[UnitState], DagRun]:
    """Drive ``dag`` to its end on this rank (every rank calls it with the same DAG).

    Returns this rank's units of ``dag.target``, the states the DAG consumed (their groups are
    the caller's to release) and the run's record. Raises TransitionError when the scheduler
    stalls and CommunicationError when a transfer fails (the sources are then intact)."""
    ex = RankDagExecutor(setup, dag, held, global_rank, store, namespace, timeout_s=timeout_s,
                         lr=lr, device=device)
    t0 = time.perf_counter()
    # the smallest device of the cluster (node groups of several types: the tightest bound)
    capacity = min(t.memory_bytes for t in setup.cluster.types)
    drive(Scheduler(dag, capacity_bytes=capacity), ex)
    ex.run.seconds = time.perf_counter() - t0
    for tex in ex.executors.values():
        for name, n in tex.transports.items():
            ex.run.transports[name] = ex.run.transports.get(name, 0) + n
    final = ex.held()
    target = set(dag.target)
    stray = [e for e in final if e not in target]
    if stray:
        raise TransitionError(f"rank {global_rank}: the DAG ended with units not in the target: "
                              f"{stray[:3]}")
    return final, ex.dropped, ex.run
