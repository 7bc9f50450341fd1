"""Loss exposure: the seconds a plan expects to lose to a checkpoint/restart when the pool
shrinks (pure; DESIGN.md §2.1, "Admit").

A target whose every replica of some model-stage sits on a few nodes loses that state when
those nodes go, and the job restarts from its checkpoint — minutes, where a transition costs
seconds. Payback value (ΔL·H − L̂_tran) does not see it: two targets equally fast are equally
good to it whether they spread a model-stage's replicas over every node or pack them on two.
The controller adds each plan's exposure to its cost over the horizon (:mod:`.admission`).

The model knows nothing of the trace beforehand; it learns from this job's own pool while a plan
runs (:class:`PoolHistory`; the wait for a first feasible pool does not count):

- shrinks arrive at ``rate_per_step`` = half the pool's observed changes per step observed (a
  pool that grows shrinks again: spot capacity comes and goes); 0 until the first change, so a
  job on a fixed allocation weighs no exposure and decides as before;
- a shrink removes each node with probability ``share``, the mean share of the pool the observed
  changes moved (GPUs added or removed over the larger of the two pools);
- a replica is lost when any of its nodes goes; replicas on the same nodes fall together and
  replicas on different nodes independently, so a model-stage loses every replica with
  probability ∏ over its distinct node sets of 1 − (1 − share)^|nodes|;
- a frozen copy (actor-gen, critic-inf: :meth:`nereus.spec.workflow.Workflow.copy_source`)
  that loses every replica is rebuilt from its source after the change's DAG
  (:mod:`nereus.transition.rebuild`), so only the other model-stages count (a copy lost with
  its source restarts through the source);
- exposure = P(a shrink within H steps) · P(restart | a shrink) · the checkpoint/restart's
  seconds (:func:`nereus.transition.fallbacks.checkpoint_restart_s`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan
from nereus.transition.fallbacks import checkpoint_restart_s


@dataclass(frozen=True)
class PoolHistory:
    """What the controller has seen of its pool: observations, the changes among them, and the
    summed share of the pool each change moved (GPUs added or removed over the larger pool)."""

    last_pool: tuple[int, ...] = ()
    steps: int = 0
    changes: int = 0
    changed_share: float = 0.0

    def observed(self, pool: tuple[int, ...]) -> PoolHistory:
        """The history after one more observation of ``pool``."""
        before, after = set(self.last_pool), set(pool)
        if not self.last_pool or before == after:
            return replace(self, last_pool=tuple(pool), steps=self.steps + 1)
        moved = len(before ^ after) / max(len(before), len(after))
        return PoolHistory(tuple(pool), self.steps + 1, self.changes + 1,
                             self.changed_share + min(moved, 1.0))

    @property
    def rate_per_step(self) -> float:
        """Shrinks per step: half the observed changes (a pool that grows shrinks again)."""
        return self.changes / (2 * self.steps) if self.steps else 0.0

    @property
    def share(self) -> float:
        """Mean share of the pool a change moved (0 before the first)."""
        return self.changed_share / self.changes if self.changes else 0.0

    def shrink_within(self, horizon_steps: float) -> float:
        """P(at least one shrink within ``horizon_steps`` steps)."""
        rate = min(self.rate_per_step, 1.0)
        return 1.0 - (1.0 - rate) ** max(horizon_steps, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"last_pool": list(self.last_pool), "steps": self.steps,
                "changes": self.changes, "changed_share": self.changed_share}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> PoolHistory:
        return PoolHistory(tuple(int(g) for g in d["last_pool"]), int(d["steps"]),
                             int(d["changes"]), float(d["changed_share"]))


def stage_loss_probability(setup: Setup, replicas: tuple[tuple[int, ...], ...],
                           share: float) -> float:
    """P(every replica lost | a shrink removing each node with probability ``share``)."""
    if share <= 0.0:
        return 0.0
    gpn = setup.cluster.gpus_per_node
    seen: set[frozenset[int] | int] = set()
    p = 1.0
    for r in replicas:
        lo, hi = min(r) // gpn, max(r) // gpn
        nodes = lo if lo == hi else frozenset(g // gpn for g in r)
        if nodes in seen:
            continue  # on the same nodes as a replica before: they fall together
        seen.add(nodes)
        p *= 1.0 - (1.0 - share) ** (1 if isinstance(nodes, int) else len(nodes))
        if p < 1e-12:  # many distinct node sets: nothing left to lose
            return 0.0
    return p


def restart_probability(setup: Setup, plan: ExecutionPlan, share: float) -> float:
    """P(a shrink costs ``plan`` a checkpoint/restart) (module docstring)."""
    if share <= 0.0:
        return 0.0
    wf = setup.job.workflow
    survive = 1.0
    for sp in plan.stages:
        if wf.copy_source(sp.name) is not None:  # rebuilt from its source
            continue
        survive *= 1.0 - stage_loss_probability(setup, sp.replicas, share)
    return 1.0 - survive


def exposure_s(setup: Setup, plan: ExecutionPlan, history: PoolHistory,
               horizon_steps: float) -> float:
    """Expected seconds ``plan`` loses to a checkpoint/restart within ``horizon_steps``."""
    p_event = history.shrink_within(horizon_steps)
    if p_event <= 0.0:
        return 0.0
    return p_event * restart_probability(setup, plan, history.share) * checkpoint_restart_s(setup)
