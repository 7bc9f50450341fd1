"""A planned transition: the DAG of a plan change and its L̂_tran, planned once (pure).

:func:`plan_transition` is the one function the controller calls (through its planner port):
from the units of the running plan that survive on the pool to the units of the target. The
:class:`PlannedTransition` it returns travels with the decision: admission weighs its
``cost_s``, the log records that figure, and rank 0 sends its :attr:`~PlannedTransition.dag`
to the ranks in the same message as the target plan, so nothing downstream compiles again.

Two compilers make the same DAG: the batched path (:mod:`nereus.transition.batched`, GPU
arrays, for large transitions) and the reference compiler
(:mod:`nereus.transition.reference`, per-primitive records, for small ones and every input the
batched path does not cover). :func:`plan_units` and :func:`plan_plans` pick one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

from nereus.cost.calibration import Calibration
from nereus.emu.primitives import (
    StateSizer,
    model_replicated_sizer,
    model_state_sizer,
    shard_bytes,
)
from nereus.emu.unit import Emu, emus_of_plan
from nereus.errors import TransitionError
from nereus.spec.hardware import ClusterSpec
from nereus.spec.job import JobSpec, Setup
from nereus.spec.plan import ExecutionPlan
from nereus.transition.batched.assemble import BatchedDag, expand
from nereus.transition.batched.blocks import DESTROY
from nereus.transition.batched.cost import durations
from nereus.transition.batched.plan import batched_plans, batched_units
from nereus.transition.cost import rates, transition_cost_s
from nereus.transition.dag import TransitionDag
from nereus.transition.graph import longest_path
from nereus.transition.reference.compile import compile_transition
from nereus.transition.residency import ConflictSpec

if TYPE_CHECKING:
    from nereus.transition.rebuild import CopyRebuild
    from nereus.transition.staged import StagedTransition

EXECUTORS = ("dag", "staged", "gather-reload", "restart")


@dataclass(frozen=True)
class PlannedTransition:
    """A compiled transition and its L̂_tran on the cluster it was planned for.

    A DAG: exactly one of ``batched`` (the batched path's arrays) and ``reference`` (the
    reference compiler's DAG) is set; :attr:`dag` is the per-primitive DAG either way (equal to
    what the reference compiler returns), built on first use. A host-staged change
    (``staged``, :mod:`nereus.transition.staged`): some model-stages' state parked in host
    memory around the DAG of the others. Either may be followed by ``rebuilt`` frozen copies
    whose every replica was lost, filled from their source. No DAG at all (``restart_reason``): gather-and-reload
    in process, or (``checkpoint``) a checkpoint/restart (:mod:`nereus.transition.fallbacks`)."""

    cost_s: float
    batched: BatchedDag | None = None
    reference: TransitionDag | None = None
    restart_reason: str = ""  # no DAG: the runtime gathers and reloads the state (cost_s: that)
    staged: StagedTransition | None = None
    checkpoint: bool = False  # no DAG and no gather-and-reload: checkpoint/restart
    # frozen copies lost with their units, built after the DAG (or staged change) from their
    # source's target units (:mod:`nereus.transition.rebuild`); their cost is in cost_s
    rebuilt: tuple[CopyRebuild, ...] = ()

    @staticmethod
    def restart(cost_s: float, reason: str) -> PlannedTransition:
        """No DAG exists (``reason``): the change runs as an in-process gather-and-reload,
        estimated at ``cost_s``."""
        return PlannedTransition(cost_s, restart_reason=reason or "no transition DAG")

    @staticmethod
    def checkpoint_restart(cost_s: float, reason: str) -> PlannedTransition:
        """Neither a DAG nor gather-and-reload can run (``reason``): checkpoint and restart."""
        return PlannedTransition(cost_s, restart_reason=reason or "no transition DAG",
                                 checkpoint=True)

    @property
    def executor(self) -> str:
        """One of :data:`EXECUTORS`: ``"dag"`` (the DAG's primitives run on the ranks),
        ``"staged"`` (host-staged: :mod:`nereus.transition.staged`), ``"gather-reload"`` or
        ``"restart"`` (checkpoint/restart)."""
        if self.staged is not None:
            return "staged"
        if self.restart_reason:
            return "restart" if self.checkpoint else "gather-reload"
        return "dag"

    @property
    def path(self) -> str:
        """Which compiler made the DAG: ``"batched"``, ``"reference"`` or ``"none"``."""
        if self.batched is not None:
            return "batched"
        return "reference" if self.reference is not None else "none"

    @cached_property
    def dag(self) -> TransitionDag:
        """The per-primitive DAG (a staged change: that of the model-stages not staged;
        TransitionError for a restart: there is none)."""
        if self.staged is not None:
            return self.staged.rest.dag
        if self.batched is not None:
            return expand(self.batched)
        if self.reference is None:
            raise TransitionError(f"no transition DAG: {self.restart_reason}")
        return self.reference


def _planned(batched: BatchedDag | None, reference: TransitionDag | None,
             cluster: ClusterSpec, calib: Calibration | None) -> PlannedTransition:
    if batched is not None and cluster.heterogeneous:
        # per-pair link classes (the host transport between vendors): cost the expanded DAG
        return PlannedTransition(transition_cost_s(expand(batched), cluster, calib),
                                 batched=batched)
    if batched is not None:
        path_s = longest_path(batched.topo, durations(batched.blocks, batched.n, cluster, calib))
        r = rates(cluster, calib)
        builds = sum(blk.rows.shape[0] for _, blk, _, _ in batched.blocks if blk.kind != DESTROY)
        return PlannedTransition(r.fixed_s + r.build_s * builds + path_s, batched=batched)
    assert reference is not None
    return PlannedTransition(transition_cost_s(reference, cluster, calib), reference=reference)


def plan_units(
    source: Sequence[Emu],
    target: Sequence[Emu],
    sizer: StateSizer,
    cluster: ClusterSpec,
    *,
    capacity_bytes: int | Mapping[int, int] | None = None,
    reserved_bytes: Mapping[int, int] | None = None,
    stage_rank: Mapping[str, int] | None = None,
    spare_gpus: Sequence[int] = (),
    conflicts: ConflictSpec = None,
    replicated: StateSizer | None = None,
    calib: Calibration | None = None,
) -> PlannedTransition:
    """The transition from the EMU collection ``source`` to ``target`` (arguments of
    :func:`nereus.transition.reference.compile.compile_transition`, same DAG, same errors)."""
    kw = {"capacity_bytes": capacity_bytes, "reserved_bytes": reserved_bytes,
          "stage_rank": stage_rank, "spare_gpus": spare_gpus, "conflicts": conflicts,
          "replicated": replicated}
    got = batched_units(source, target, sizer, **kw)  # type: ignore[arg-type]
    if got is not None:
        return _planned(got, None, cluster, calib)
    return _planned(None, compile_transition(source, target, sizer, **kw),  # type: ignore[arg-type]
                    cluster, calib)


def plan_plans(
    current: ExecutionPlan,
    target: ExecutionPlan,
    states: Mapping[str, str],
    sizer: StateSizer,
    cluster: ClusterSpec,
    *,
    capacity_bytes: int | Mapping[int, int] | None = None,
    reserved_bytes: Mapping[int, int] | None = None,
    stage_rank: Mapping[str, int] | None = None,
    spare_gpus: Sequence[int] = (),
    conflicts: ConflictSpec = None,
    replicated: StateSizer | None = None,
    alive: Collection[int] | None = None,
    calib: Calibration | None = None,
) -> PlannedTransition:
    """:func:`plan_units` from the units of ``current`` (those whose GPUs are all in ``alive``,
    when given) to the units of ``target``, read straight from the plans' replica tuples."""
    got = batched_plans(current, target, states, sizer, capacity_bytes=capacity_bytes,
                        reserved_bytes=reserved_bytes, stage_rank=stage_rank,
                        spare_gpus=spare_gpus, conflicts=conflicts, replicated=replicated,
                        alive=alive)
    if got is not None:
        return _planned(got, None, cluster, calib)
    st = dict(states)
    units = emus_of_plan(current, st)
    if alive is not None:
        live = set(alive)
        units = tuple(u for u in units if live.issuperset(u.gpus))
    return _planned(None, compile_transition(
        units, emus_of_plan(target, st), sizer, capacity_bytes=capacity_bytes,
        reserved_bytes=reserved_bytes, stage_rank=stage_rank, spare_gpus=spare_gpus,
        conflicts=conflicts, replicated=replicated), cluster, calib)


@lru_cache(maxsize=32)
def job_sizers(job: JobSpec) -> tuple[StateSizer, StateSizer]:
    """(state bytes, TP-replicated bytes) per model-stage of ``job`` (one pair per job: the
    replicated part walks every tensor of the model, and the controller plans many
    transitions of one job)."""
    wf = job.workflow
    models = {ms.name: job.model(ms.role) for ms in wf.model_stages}
    trainable = {ms.name: ms.trainable for ms in wf.model_stages}
    return (model_state_sizer(models, trainable, job.dtype_bytes),
            model_replicated_sizer(models, trainable, job.dtype_bytes))


def stage_states(setup: Setup) -> dict[str, str]:
    """Logical state per model-stage for the DAG: each model-stage's units are replicas of one
    state (actor-gen holds weights only, actor-train weights and optimizer: distinct states)."""
    return {ms.name: ms.name for ms in setup.job.workflow.model_stages}


def device_capacity(setup: Setup) -> int | dict[int, int]:
    """Device bytes per GPU for the DAG's memory check: one figure, or per GPU on a cluster of
    several hardware types (each GPU its own type's memory)."""
    cl = setup.cluster
    if cl.heterogeneous:
        return {g: cl.gpu_of(g).memory_bytes for g in cl.all_gpus()}
    return cl.gpu.memory_bytes


def plan_without(plan: ExecutionPlan, names: Collection[str]) -> ExecutionPlan:
    """``plan`` without the model-stages ``names`` (those a change handles apart from its DAG)."""
    return ExecutionPlan(tuple(sp for sp in plan.stages if sp.name not in names))


def check_target_fits(setup: Setup, target: ExecutionPlan,
                      capacity: int | Mapping[int, int]) -> None:
    """TransitionError when the target's units alone (their state, the end of any change)
    exceed some GPU's ``capacity``."""
    sizer, replicated = job_sizers(setup.job)
    final: dict[int, int] = {}
    for v in emus_of_plan(target, stage_states(setup)):
        b = shard_bytes(sizer(v.model_stage), v.layout, replicated(v.model_stage))
        for g in v.gpus:
            final[g] = final.get(g, 0) + b
    over = [g for g, b in sorted(final.items())
            if b > (capacity if isinstance(capacity, int) else capacity[g])]
    if over:
        raise TransitionError(f"the target's units alone exceed GPU {over[0]}'s memory "
                              f"({final[over[0]]} bytes)")


def plan_transition(setup: Setup, current: ExecutionPlan, target: ExecutionPlan,
                    pool: Sequence[int] | None = None,
                    calib: Calibration | None = None) -> PlannedTransition:
    """The transition from the units of ``current`` that survive on ``pool`` (all of them when
    None) to the units of ``target``, with L̂_tran on ``setup.cluster`` (under ``calib``: the
    transition rates measured so far, :func:`nereus.transition.cost.rates`).

    Raises TransitionError when no DAG exists — including when every replica of some
    model-stage was lost (its state must come from a checkpoint)."""
    wf = setup.job.workflow
    sizer, replicated = job_sizers(setup.job)
    alive = None if pool is None else set(pool)
    lost = sorted(sp.name for sp in current.stages
                  if not any(alive is None or alive.issuperset(r) for r in sp.replicas))
    if lost:
        raise TransitionError(f"every replica of {', '.join(lost)} was lost")
    return plan_plans(current, target, stage_states(setup), sizer, setup.cluster,
                      capacity_bytes=device_capacity(setup), conflicts=wf.concurrent,
                      replicated=replicated, alive=alive, calib=calib)
