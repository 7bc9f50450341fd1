"""One scheduler core for simulated and real execution of a transition DAG (DESIGN.md §2.3 item 4).

:class:`Scheduler` only does bookkeeping: a primitive is ready when its predecessors are done, no
running primitive of a conflicting model-stage uses its GPUs, no unit of a conflicting model-stage
lives on the GPUs it acquires, and its bytes fit beside what else lives there. :func:`drive` is the
single loop: it starts every ready primitive on an :class:`Executor` and feeds completions back. The simulator is an Executor with a virtual clock;
the runtime supplies one that runs the primitives on ranks.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from nereus.emu.primitives import Extend, Primitive, consumed, produced
from nereus.emu.unit import Emu
from nereus.errors import TransitionError
from nereus.transition.dag import TransitionDag
from nereus.transition.residency import ConflictSpec, exclusion_for


class Executor(Protocol):
    def start(self, index: int, primitive: Primitive) -> None:
        """Begin running one primitive (must not block until it finishes)."""

    def wait(self) -> Sequence[int]:
        """Block until at least one started primitive finished; return the finished indices."""


class Scheduler:
    """Ready-set bookkeeping over one DAG; no threads, no clock.

    GPU use follows the DAG's conflict relation (see :mod:`residency`): a primitive waits for
    running primitives of its own or a conflicting model-stage on its GPUs, and an acquisition
    waits while a unit of its own or a conflicting model-stage lives on a target GPU. Units and
    running primitives of co-resident model-stages share GPUs; their bytes add up in the memory
    check (live units' shards + running primitives' buffers + reserved ≤ capacity).
    """

    def __init__(
        self,
        dag: TransitionDag,
        *,
        capacity_bytes: int | Mapping[int, int] | None = None,
        reserved_bytes: Mapping[int, int] | None = None,
        conflicts: ConflictSpec = None,
    ) -> None:
        self.dag = dag
        n = len(dag.primitives)
        self._excl = dag.exclusion if conflicts is None else exclusion_for(
            {u.model_stage for u in dag.source} | {u.model_stage for u in dag.target}, conflicts)
        self._preds_left = [len(p) for p in dag.preds]
        self._succs = dag.succs
        self._capacity = capacity_bytes
        self._reserved = dict(reserved_bytes or {})
        self._waiting = set(range(n))
        self._running: set[int] = set()
        self._busy: dict[int, list[str]] = {}  # GPU → model-stages of running primitives on it
        self._done = 0
        self._pos = {i: k for k, i in enumerate(dag.order)}
        self._free = {i for i in range(n) if not self._preds_left[i]}  # waiting, preds done
        self.owners: dict[int, list[Emu]] = {}
        self._bytes: dict[int, int] = {}  # GPU → live units' shards + running buffers
        self._extra: dict[int, dict[int, int]] = {}  # running primitive → GPU → buffer bytes
        self.live: set[Emu] = set()
        for u in dag.source:
            self._add_unit(u)
        self.completed: list[int] = []

    @property
    def owner(self) -> dict[int, Emu]:
        """GPU → one live unit on it (the first), for callers that only ask whether it is held."""
        return {g: us[0] for g, us in self.owners.items() if us}

    def _resident(self, u: Emu) -> int:
        return self.dag.unit_bytes(u)

    def _add_unit(self, u: Emu) -> None:
        self.live.add(u)
        b = self._resident(u)
        for g in u.gpus:
            self.owners.setdefault(g, []).append(u)
            self._bytes[g] = self._bytes.get(g, 0) + b

    def _drop_unit(self, u: Emu) -> None:
        self.live.discard(u)
        b = self._resident(u)
        for g in u.gpus:
            self.owners[g].remove(u)
            self._bytes[g] -= b

    @property
    def bytes_now(self) -> dict[int, int]:
        """GPU → bytes of its live units' shards and its running primitives' buffers now."""
        return dict(self._bytes)

    @property
    def done(self) -> bool:
        return self._done == len(self.dag.primitives)

    @property
    def running(self) -> frozenset[int]:
        return frozenset(self._running)

    def _buffers(self, p: Primitive) -> dict[int, int]:
        """Bytes ``p`` adds on each GPU while it runs (its peak minus its inputs' shards)."""
        ins = consumed(p) + ((p.src,) if isinstance(p, Extend) else ())
        out = dict(p.peak_bytes())
        for u in ins:
            b = self._resident(u)
            for g in u.gpus:
                if g in out:
                    out[g] -= b
        return out

    def _blocked(self, i: int, busy: Mapping[int, list[str]], pending: Mapping[int, int]) -> bool:
        p = self.dag.primitives[i]
        ms = p.model_stage
        excl = self._excl
        for g in p.busy_gpus:
            if any(excl.exclusive(ms, m) for m in busy.get(g, ())):
                return True
        for g in p.acquires:
            if any(excl.exclusive(ms, u.model_stage) for u in self.owners.get(g, ())):
                return True
        if self._capacity is None:
            return False
        for g, b in self._buffers(p).items():
            cap = self._capacity if isinstance(self._capacity, int) else self._capacity[g]
            if self._reserved.get(g, 0) + self._bytes.get(g, 0) + pending.get(g, 0) + b > cap:
                return True
        return False

    def can_start(self, i: int) -> bool:
        if i not in self._waiting or self._preds_left[i]:
            return False
        return not self._blocked(i, self._busy, {})

    def ready(self) -> list[int]:
        """Ready primitives in priority order that can all start together (start them all)."""
        out: list[int] = []
        busy = {g: list(ms) for g, ms in self._busy.items()}
        pending: dict[int, int] = {}
        for i in sorted(self._free, key=self._pos.__getitem__):
            if self._blocked(i, busy, pending):
                continue
            out.append(i)
            p = self.dag.primitives[i]
            for g in p.busy_gpus:
                busy.setdefault(g, []).append(p.model_stage)
            if self._capacity is not None:
                for g, b in self._buffers(p).items():
                    pending[g] = pending.get(g, 0) + b
        return out

    def start(self, i: int) -> None:
        if not self.can_start(i):
            raise TransitionError(f"primitive {i} is not ready")
        p = self.dag.primitives[i]
        self._waiting.discard(i)
        self._free.discard(i)
        self._running.add(i)
        for g in p.busy_gpus:
            self._busy.setdefault(g, []).append(p.model_stage)
        extra = self._buffers(p)
        self._extra[i] = extra
        for g, b in extra.items():
            self._bytes[g] = self._bytes.get(g, 0) + b

    def complete(self, i: int) -> None:
        if i not in self._running:
            raise TransitionError(f"primitive {i} completed but was not running")
        p = self.dag.primitives[i]
        self._running.discard(i)
        for g in p.busy_gpus:
            self._busy[g].remove(p.model_stage)
        for g, b in self._extra.pop(i).items():
            self._bytes[g] -= b
        for u in consumed(p):
            self._drop_unit(u)
        for u in produced(p):
            self._add_unit(u)
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
            held = sorted({u.model_stage for g in p.acquires for u in self.owners.get(g, ())
                           if self._excl.exclusive(p.model_stage, u.model_stage)})
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
