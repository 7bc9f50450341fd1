"""One scheduler core for simulated and real execution of a transition DAG (DESIGN.md §2.3 item 4).

:class:`Scheduler` only does bookkeeping: a primitive is ready when its predecessors are done, its
GPUs are not used by a running primitive, the GPUs it acquires are owned by no live unit and its
peak bytes fit. :func:`drive` is the single loop: it starts every ready primitive on an
:class:`Executor` and feeds completions back. The simulator is an Executor with a virtual clock;
the runtime supplies one that runs the primitives on ranks.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from nereus.emu.unit import Emu
from nereus.errors import TransitionError
from nereus.transition.dag import TransitionDag
from nereus.transition.primitives import Primitive, consumed, produced


class Executor(Protocol):
    def start(self, index: int, primitive: Primitive) -> None:
        """Begin running one primitive (must not block until it finishes)."""

    def wait(self) -> Sequence[int]:
        """Block until at least one started primitive finished; return the finished indices."""


class Scheduler:
    """Ready-set bookkeeping over one DAG; no threads, no clock."""

    def __init__(
        self,
        dag: TransitionDag,
        *,
        capacity_bytes: int | Mapping[int, int] | None = None,
        reserved_bytes: Mapping[int, int] | None = None,
    ) -> None:
        self.dag = dag
        n = len(dag.primitives)
        self._preds_left = [len(p) for p in dag.preds]
        self._succs = dag.succs
        self._capacity = capacity_bytes
        self._reserved = dict(reserved_bytes or {})
        self._waiting = set(range(n))
        self._running: set[int] = set()
        self._busy: set[int] = set()
        self._done = 0
        self._pos = {i: k for k, i in enumerate(dag.order)}
        self._free = {i for i in range(n) if not self._preds_left[i]}  # waiting, preds done
        self.owner: dict[int, Emu] = {g: u for u in dag.source for g in u.gpus}
        self.live: set[Emu] = set(dag.source)
        self.completed: list[int] = []

    @property
    def done(self) -> bool:
        return self._done == len(self.dag.primitives)

    @property
    def running(self) -> frozenset[int]:
        return frozenset(self._running)

    def _fits(self, p: Primitive) -> bool:
        if self._capacity is None:
            return True
        for g, b in p.peak_bytes().items():
            cap = self._capacity if isinstance(self._capacity, int) else self._capacity[g]
            if self._reserved.get(g, 0) + b > cap:
                return False
        return True

    def can_start(self, i: int) -> bool:
        p = self.dag.primitives[i]
        if i not in self._waiting or self._preds_left[i]:
            return False
        if not self._busy.isdisjoint(p.busy_gpus):
            return False
        if any(g in self.owner for g in p.acquires):
            return False
        return self._fits(p)

    def ready(self) -> list[int]:
        """GPU-disjoint ready primitives in priority order (start them all)."""
        out: list[int] = []
        taken: set[int] = set()
        for i in sorted(self._free, key=self._pos.__getitem__):
            if self.can_start(i):
                gpus = self.dag.primitives[i].busy_gpus
                if taken.isdisjoint(gpus):
                    out.append(i)
                    taken |= gpus
        return out

    def start(self, i: int) -> None:
        if not self.can_start(i):
            raise TransitionError(f"primitive {i} is not ready")
        self._waiting.discard(i)
        self._free.discard(i)
        self._running.add(i)
        self._busy |= self.dag.primitives[i].busy_gpus

    def complete(self, i: int) -> None:
        if i not in self._running:
            raise TransitionError(f"primitive {i} completed but was not running")
        p = self.dag.primitives[i]
        self._running.discard(i)
        self._busy -= p.busy_gpus
        for u in consumed(p):
            self.live.discard(u)
            for g in u.gpus:
                self.owner.pop(g, None)
        for u in produced(p):
            self.live.add(u)
            for g in u.gpus:
                self.owner[g] = u
        self._done += 1
        self.completed.append(i)
        for j in self._succs[i]:
            self._preds_left[j] -= 1
            if not self._preds_left[j]:
                self._free.add(j)

    def stall_reason(self) -> str:
        waiting = sorted(self._waiting, key=self._pos.__getitem__)[:3]
        parts = []
        for i in waiting:
            p = self.dag.primitives[i]
            held = sorted({self.owner[g].model_stage for g in p.acquires if g in self.owner})
            parts.append(f"{type(p).__name__} #{i} of {p.model_stage}"
                         + (f" (GPUs held by {', '.join(held)})" if held else ""))
        return "no primitive can start: " + "; ".join(parts)


def drive(sched: Scheduler, executor: Executor) -> list[int]:
    """Run the DAG to the end on ``executor``; returns the completion order."""
    while not sched.done:
        for i in sched.ready():
            sched.start(i)
            executor.start(i, sched.dag.primitives[i])
        if not sched.running:
            raise TransitionError(sched.stall_reason())
        for i in executor.wait():
            sched.complete(i)
    return list(sched.completed)


class SimulatedExecutor:
    """Virtual-clock executor.

    Primitive ``i`` started at ``t`` finishes at ``max(t, not_before_s[i]) + delay_s[i] +
    durations_s[i]`` (a late launch or a dispatch latency holds its GPUs meanwhile).
    """

    def __init__(
        self,
        durations_s: Sequence[float],
        delay_s: Sequence[float] | None = None,
        not_before_s: Sequence[float] | None = None,
    ):
        n = len(durations_s)
        self.durations_s = list(durations_s)
        self.delay_s = list(delay_s) if delay_s is not None else [0.0] * n
        self.not_before_s = list(not_before_s) if not_before_s is not None else [0.0] * n
        self.now_s = 0.0
        self.start_s: dict[int, float] = {}
        self.finish_s: dict[int, float] = {}
        self._heap: list[tuple[float, int]] = []

    def start(self, index: int, primitive: Primitive) -> None:
        self.start_s[index] = self.now_s
        begin = max(self.now_s, self.not_before_s[index])
        fin = begin + self.delay_s[index] + self.durations_s[index]
        heapq.heappush(self._heap, (fin, index))

    def wait(self) -> Sequence[int]:
        fin, i = heapq.heappop(self._heap)
        self.now_s = fin
        out = [i]
        while self._heap and self._heap[0][0] <= fin:
            out.append(heapq.heappop(self._heap)[1])
        for j in out:
            self.finish_s[j] = fin
        return out


@dataclass(frozen=True)
class SimResult:
    makespan_s: float
    start_s: tuple[float, ...]
    finish_s: tuple[float, ...]
    order: tuple[int, ...]


def simulate(
    dag: TransitionDag,
    durations_s: Sequence[float],
    *,
    delay_s: Sequence[float] | None = None,
    not_before_s: Sequence[float] | None = None,
    capacity_bytes: int | Mapping[int, int] | None = None,
    reserved_bytes: Mapping[int, int] | None = None,
) -> SimResult:
    """Discrete-event simulation of the DAG with the same scheduler core as real execution."""
    sched = Scheduler(dag, capacity_bytes=capacity_bytes, reserved_bytes=reserved_bytes)
    ex = SimulatedExecutor(durations_s, delay_s, not_before_s)
    order = drive(sched, ex)
    n = len(dag.primitives)
    return SimResult(
        makespan_s=ex.now_s,
        start_s=tuple(ex.start_s[i] for i in range(n)),
        finish_s=tuple(ex.finish_s[i] for i in range(n)),
        order=tuple(order),
    )
