"""Plan change on the ranks: gather the global state of the running plan, reload it in the new.

This is the in-process checkpoint/restart path of DESIGN.md §2.1 (urgent fallback): the logical
state Λ of every model-stage — parameters, Adam moments, counters — is read from one complete
replica (one whose ranks are all still in the pool when there is one), all-gathered over MPI
(framed: :mod:`nereus.runtime.mpi.frames`),
the old plan's units and process groups are destroyed and the new plan's are built from it.
It is exact (the same global values in a new layout) and needs no transition DAG. Plan changes
normally run as a transition DAG of EMU primitives (:mod:`nereus.runtime.execution.plan_change`); this path
is the fallback when no DAG exists (the last replica of a model-stage left the pool, or no order
fits memory) and the checkpoint-restart-in-process baseline the benchmarks compare against.

In this emulation a removed node's ranks keep running (they only leave the pool); when every
replica of a model-stage sat on removed ranks, its state is still read from them and the event
says so — on a real cluster that state would come from a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nereus.runtime.mpi.frames import allgather
from nereus.runtime.worker.state import FIELDS, Counters
from nereus.runtime.worker.units import (
    Glob,
    PlanUnits,
    assemble_global,
    counters_of,
    local_pieces,
    spec_of,
)


def source_replica(units: PlanUnits, name: str, pool: Sequence[int]) -> tuple[int, bool]:
    """(dp_rank of the replica to read, whether it survived in the pool)."""
    alive = set(pool)
    for dp_rank, emu in enumerate(units.stages[name].emus):
        if alive.issuperset(emu.gpus):
            return dp_rank, True
    return 0, False


def gather_state(units: PlanUnits, comm: Any, pool: Sequence[int], skip: Sequence[str] = ()
                 ) -> tuple[dict[str, Glob], dict[str, tuple[Counters, float]], list[str]]:
    """Every model-stage's global state on every rank (collective over ``comm``), but those in
    ``skip``. A ZeRO stage's (``units.zero_names``) is read by DeepSpeed, collective over its
    DP group."""
    wf = units.setup.job.workflow
    contrib: dict[str, Any] = {}
    lost: list[str] = []
    stages = {n: su for n, su in units.stages.items() if n not in skip}
    for name, su in stages.items():
        src, survived = source_replica(units, name, pool)
        if not survived:
            lost.append(name)
        if name in units.zero_names:
            from nereus.runtime.worker.zero_units import zero_pieces

            mine = su.my_replica()
            if mine is None:
                continue
            zp = zero_pieces(mine[1], report=mine[0] == src)  # type: ignore[arg-type]
            if mine[0] == src:
                contrib[name] = {"pieces": zp, "counters": counters_of(mine[1])}
            continue
        st = su.mine.get(src)
        if st is None:
            continue
        fields = FIELDS if wf.by_name(name).trainable else FIELDS[:1]
        entry: dict[str, Any] = {"pieces": local_pieces(st, fields)}
        if st.position == (0, 0):
            entry["counters"] = counters_of(st)
        contrib[name] = entry
    globs: dict[str, Glob] = {}
    pieces, counters = allgather_contributions(comm, contrib)
    for name in stages:
        globs[name] = assemble_global(spec_of(units.setup, name), pieces.get(name, []))
    return globs, counters, lost


def allgather_contributions(comm: Any, contrib: dict[str, Any]
                            ) -> tuple[dict[str, list[Any]], dict[str, tuple[Counters, float]]]:
    """Every rank's ``{model_stage: {"pieces": [...], "counters"?: ...}}`` merged on every rank
    (collective over ``comm``): the pieces per model-stage and the counters of each."""
    wire: dict[str, Any] = {}
    for name, entry in contrib.items():  # plain data: counters as their fields
        wire[name] = {"pieces": entry["pieces"]}
        if "counters" in entry:
            c, adam = entry["counters"]
            wire[name]["counters"] = [vars(c), adam]
    pieces: dict[str, list[Any]] = {}
    counters: dict[str, tuple[Counters, float]] = {}
    for c in allgather(comm, wire, "state"):
        for name, entry in c.items():
            pieces.setdefault(name, []).extend(entry["pieces"])
            if "counters" in entry:
                fields, adam = entry["counters"]
                counters[name] = (Counters(**fields), float(adam))
    return pieces, counters


def state_bytes(globs: dict[str, Glob]) -> int:
    return sum(int(a.nbytes) for g in globs.values() for d in g.values() for a in d.values())
