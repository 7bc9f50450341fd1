"""Plan changes without a transition DAG: gather-and-reload and checkpoint/restart (pure).

Where no DAG of EMU primitives exists (and none staged through host memory,
:mod:`nereus.transition.staged`), a plan change still has two ways, each priced here so that
the controller can weigh them like any other transition (DESIGN.md §2.1):

- **gather-and-reload** (in process): every model-stage's state is read from one surviving
  replica, all-gathered to every rank over the control plane, and every unit of the target is
  rebuilt from it (:mod:`nereus.runtime.execution.gather_reload`). It needs a replica of every
  model-stage on the pool (or, for a frozen copy of a trained model-stage, of its source), and
  host memory on every rank for the whole logical state (the all-gather gives every rank all of
  it). Cost: :func:`nereus.transition.cost.restart_cost_s`.
- **checkpoint/restart**: the job writes its state to the parallel filesystem, relaunches and
  reads it back — always possible (a model-stage whose every replica was lost comes back from
  the last checkpoint), and the most expensive: a relaunch and start-up of ``RESTART_BASE_S``
  plus the whole state written and read at ``RESTART_STORAGE_GBPS``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nereus.cost.calibration import Calibration
from nereus.spec.job import Setup
from nereus.spec.model import state_bytes_per_param
from nereus.spec.plan import ExecutionPlan
from nereus.transition.cost import restart_cost_s
from nereus.transition.planned import PlannedTransition

# Checkpoint/restart: relaunch and engine start-up, plus writing and reading the whole logical
# state through the parallel filesystem at this rate.
RESTART_BASE_S = 120.0
RESTART_STORAGE_GBPS = 5.0


def stage_state_bytes(setup: Setup, name: str) -> int:
    """Bytes of the logical state of model-stage ``name`` (one replica, every position)."""
    ms = setup.job.workflow.by_name(name)
    params = setup.job.model(ms.role).num_params()
    return params * state_bytes_per_param(setup.job.dtype_bytes, ms.trainable)


def total_state_bytes(setup: Setup) -> int:
    """Bytes of every model-stage's logical state together."""
    return sum(stage_state_bytes(setup, ms.name) for ms in setup.job.workflow.model_stages)


def checkpoint_restart_s(setup: Setup) -> float:
    """Seconds of a checkpoint/restart: relaunch plus the whole state written and read."""
    return RESTART_BASE_S + 2 * total_state_bytes(setup) / (RESTART_STORAGE_GBPS * 1e9)


def gather_reload_s(setup: Setup, current: ExecutionPlan, target: ExecutionPlan,
                    calib: Calibration | None = None) -> float:
    """Every changed model-stage's state gathered to all ranks and loaded, every unit of the
    target rebuilt (:func:`nereus.transition.cost.restart_cost_s`, at ``calib``'s rates)."""
    nbytes = sum(stage_state_bytes(setup, sp.name) for sp in target.stages
                 if sp not in current.stages)
    units = sum(sp.dp for sp in target.stages)
    return restart_cost_s(setup.cluster, nbytes, units, calib)


def gather_reload_blocker(setup: Setup, current: ExecutionPlan,
                          pool: Sequence[int] | None) -> str:
    """Why gather-and-reload cannot run from ``current`` on ``pool`` ("" when it can): a
    model-stage with no replica left on the pool (a frozen copy of a trained model-stage —
    actor-gen, critic-inf — comes back from a replica of its source,
    :meth:`nereus.spec.workflow.Workflow.copy_source`, as the runtime's recovery does), or a
    rank's host memory smaller than the whole state the all-gather gives it."""
    alive = None if pool is None else set(pool)
    lost = setup.job.workflow.lost_stages(
        {sp.name: any(alive is None or alive.issuperset(r) for r in sp.replicas)
         for sp in current.stages})
    if lost:
        return f"every replica of {', '.join(lost)} was lost"
    return host_memory_blocker(setup, sorted(alive) if alive is not None
                               else setup.cluster.all_gpus())


def host_memory_blocker(setup: Setup, gpus: Iterable[int]) -> str:
    """Why the ranks of ``gpus`` cannot hold the whole logical state each, as gather-and-reload
    needs ("" when they can)."""
    need = total_state_bytes(setup)
    cl = setup.cluster
    if cl.groups:  # several hardware types: the smallest host memory among these GPUs
        host = min((cl.gpu_of(g).host_memory_bytes for g in gpus), default=0)
    else:
        host = cl.gpu.host_memory_bytes if any(True for _ in gpus) else 0
    if need > host:
        return (f"gather-and-reload needs the whole state ({need / 1e9:.1f} GB) in every "
                f"rank's host memory ({host / 1e9:.1f} GB per device)")
    return ""


def fallback_transition(setup: Setup, current: ExecutionPlan, target: ExecutionPlan,
                        pool: Sequence[int] | None, calib: Calibration | None,
                        why_no_dag: str) -> PlannedTransition:
    """The change without a DAG (``why_no_dag``): gather-and-reload where it can run, else
    checkpoint/restart; the reason names both."""
    blocker = gather_reload_blocker(setup, current, pool)
    if not blocker:
        return PlannedTransition.restart(gather_reload_s(setup, current, target, calib),
                                         why_no_dag)
    why = blocker if blocker == why_no_dag else f"{why_no_dag}; {blocker}"
    return PlannedTransition.checkpoint_restart(checkpoint_restart_s(setup), why)
