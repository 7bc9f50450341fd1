"""The state at the last safe boundaries, kept on every rank, and rebuilt from survivors (effectful).

A rank can die in the middle of a step (some DP replicas have applied an Adam update, others
not) or of a transition (old units half destroyed). The survivors therefore restart from a safe
boundary — after a step's weight sync, or after a transition — where every replica of a
model-stage holds the same logical state. Each rank keeps a copy of its own shards at its last
two boundaries (:class:`BoundaryBook`): two, because under a failure a collective can complete
on some ranks and fail on others, so live ranks can be one boundary apart, never two (between two
boundaries every rank takes part in an all-gather). The survivors agree on the older of their
latest boundaries (:func:`agree_boundary`) and :func:`gather_survivors` assembles each
model-stage's global state from one replica whose ranks all survived. A model-stage none of
whose replicas survived is *lost*: its state has to come from a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nereus.runtime.execution.gather_reload import allgather_contributions
from nereus.runtime.mpi.frames import allgather
from nereus.runtime.worker.state import FIELDS, Counters
from nereus.runtime.worker.units import (
    Glob,
    PlanUnits,
    assemble_global,
    counters_of,
    local_pieces,
    spec_of,
    stage_emus,
)
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan

Pieces = list[Any]


@dataclass(frozen=True)
class Boundary:
    """This rank's shards of plan ``version`` before step ``step`` runs."""

    step: int
    version: int
    plan: ExecutionPlan
    held: dict[str, dict[int, tuple[Pieces, tuple[Counters, float] | None]]]

    @property
    def key(self) -> tuple[int, int]:
        return (self.step, self.version)


def take_boundary(units: PlanUnits, step: int, version: int) -> Boundary:
    """Copy this rank's shards of every unit (parameters; Adam moments of trained stages)."""
    wf = units.setup.job.workflow
    held: dict[str, dict[int, tuple[Pieces, tuple[Counters, float] | None]]] = {}
    for name, su in units.stages.items():
        fields = FIELDS if wf.by_name(name).trainable else FIELDS[:1]
        held[name] = {dp_rank: (local_pieces(st, fields),
                                counters_of(st) if st.position == (0, 0) else None)
                      for dp_rank, st in su.mine.items()}
    return Boundary(step, version, units.plan, held)


class BoundaryBook:
    """The last two boundaries of this rank."""

    def __init__(self) -> None:
        self.kept: list[Boundary] = []

    def record(self, b: Boundary) -> None:
        self.kept = [*self.kept[-1:], b]

    def latest(self) -> tuple[int, int]:
        return self.kept[-1].key

    def at(self, key: tuple[int, int]) -> Boundary:
        for b in self.kept:
            if b.key == key:
                return b
        raise KeyError(f"no boundary {key} on this rank (kept {[b.key for b in self.kept]})")

    def oldest_of(self, keys: Sequence[Sequence[int]]) -> Boundary:
        """The oldest of the ranks' latest boundaries ``keys`` (this rank's among them)."""
        return self.at(min((int(k[0]), int(k[1])) for k in keys))


def agree_boundary(book: BoundaryBook, comm: Any) -> Boundary:
    """The oldest of the survivors' latest boundaries (collective over the survivors)."""
    return book.oldest_of(allgather(comm, list(book.latest()), "boundary"))


def surviving_replica(plan: ExecutionPlan, name: str, pool: Sequence[int]) -> int | None:
    """The DP rank of the first replica of ``name`` whose ranks are all in ``pool``."""
    alive = set(pool)
    for dp_rank, emu in enumerate(stage_emus(plan.stage(name))):
        if alive.issuperset(emu.gpus):
            return dp_rank
    return None


def gather_survivors(setup: Setup, b: Boundary, comm: Any, pool: Sequence[int]
                     ) -> tuple[dict[str, Glob], dict[str, tuple[Counters, float]], list[str]]:
    """Global state of every model-stage with a surviving replica on every rank, its counters,
    and the names of the lost model-stages (collective over the survivors' ``comm``)."""
    contrib: dict[str, Any] = {}
    lost: list[str] = []
    for sp in b.plan.stages:
        src = surviving_replica(b.plan, sp.name, pool)
        if src is None:
            lost.append(sp.name)
            continue
        mine = b.held.get(sp.name, {}).get(src)
        if mine is None:
            continue
        entry: dict[str, Any] = {"pieces": mine[0]}
        if mine[1] is not None:
            entry["counters"] = mine[1]
        contrib[sp.name] = entry
    pieces, counters = allgather_contributions(comm, contrib)
    globs = {sp.name: assemble_global(spec_of(setup, sp.name), pieces.get(sp.name, []))
             for sp in b.plan.stages if sp.name not in lost}
    return globs, counters, lost
