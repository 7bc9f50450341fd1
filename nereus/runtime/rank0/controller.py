"""Rank 0's controller: the pure controller state machine over the virtual CPU cluster.

Rank 0 also works as a rank (it holds units like any other rank): on CPU every rank plays one
GPU and the controller's work (a plan search over a few hundred candidates) takes milliseconds at
a step boundary, so reserving a rank for it would waste 1/N of the machine. The port is the
simulator's :class:`SearchPort` with two CPU-runtime rules on top: a model-stage runs pp > 1 only
where the runtime's layout rules allow it (:func:`nereus.emu.shards.check_layout`: Megatron's uneven
split included since issue 37; tied
embeddings run pp=1 only: plans breaking a rule are re-searched with that stage pinned to
(tp, 1)); pipeline stages run on the CPU 1F1B schedule of :mod:`nereus.engines.pipeline`), and
a transition with no executable DAG (not even one staged through host memory) is costed as the
in-process checkpoint/restart the runtime performs (gather the global state, reload into the new
layout).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nereus.control.controller import ControllerState, Decision, PlanEvaluation, controller_step
from nereus.control.options import candidate_targets
from nereus.control.planner_port import SearchPort
from nereus.control.signals import Observation
from nereus.cost.calibration import Calibration, default_calibration
from nereus.cost.fit import Sample
from nereus.emu.shards import check_layout
from nereus.emu.unit import Layout
from nereus.errors import ConfigError
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan, StagePlan
from nereus.transition import PlannedTransition
from nereus.transition.change import plan_change
from nereus.transition.fallbacks import gather_reload_s

MAX_PIN_ROUNDS = 4


@dataclass(frozen=True)
class CpuPort:
    base: SearchPort
    # model-stages whose engine holds one layout only (the DeepSpeed engine: tp = pp = 1)
    pinned: tuple[tuple[str, tuple[int, int]], ...] = ()
    # (current, target, pool) → times planned: the controller's own tally (tests read it)
    compilations: dict[tuple[ExecutionPlan, ExecutionPlan, tuple[int, ...] | None], int] = field(
        default_factory=dict, compare=False, hash=False)
    # GPUs of drained nodes: out of the pool, but their ranks still run, so their units are
    # sources of the transition that moves the state off them (nereus.runtime.failures.drain)
    draining: tuple[int, ...] = ()

    def evaluate(self, plan: ExecutionPlan, obs: Observation) -> PlanEvaluation:
        return self.base.evaluate(plan, obs)

    def stage_times(self, plan: ExecutionPlan, obs: Observation) -> dict[str, float]:
        return self.base.stage_times(plan, obs)

    def _runs_here(self, sp: StagePlan) -> bool:
        """Whether the runtime can build ``sp``'s units (its layout rules, pp > 1 included)."""
        job = self.base.setup.job
        try:
            check_layout(job.model(job.workflow.by_name(sp.name).role), Layout(sp.tp, sp.pp))
        except ConfigError:
            return False
        return True

    def _pin_pp(self, found: tuple[ExecutionPlan, float] | None, obs: Observation,
                pins: Mapping[str, tuple[int, ...]] | None = None
                ) -> tuple[ExecutionPlan, float] | None:
        layouts = dict(pins or {})
        for _ in range(MAX_PIN_ROUNDS):
            if found is None:
                return None
            deep = {sp.name: (sp.tp, 1) for sp in found[0].stages
                    if sp.pp > 1 and not self._runs_here(sp)}
            if not deep:
                return found
            layouts.update(deep)
            found = replace(self.base, layouts=layouts).search(obs)
        return None

    def search(self, obs: Observation, layouts: Mapping[str, tuple[int, ...]] | None = None
               ) -> tuple[ExecutionPlan, float] | None:
        if self.pinned:  # the engine's one layout wins over any other (tp, pp) pin
            layouts = dict(layouts or {})
            for name, lay in self.pinned:
                if tuple(layouts.get(name, lay)[:2]) != lay:
                    layouts[name] = lay
                layouts.setdefault(name, lay)
        return self._pin_pp(replace(self.base, layouts=layouts).search(obs), obs, layouts)

    def options(self, obs: Observation, current: ExecutionPlan | None
                ) -> Sequence[tuple[ExecutionPlan, float]]:
        """S* and a few slower plans with cheaper transitions from ``current``, each one the
        runtime can build (:func:`nereus.control.options.candidate_targets`), placed around
        what runs (sticky placement: the base port's ``keep``)."""
        if current is not None and self.base.keep is None:  # targets placed around what runs
            return replace(self, base=replace(self.base, keep=current)).options(obs, current)
        return candidate_targets(lambda lay: self.search(obs, lay), self.base.setup, current,
                                 self.base.setup.job.controller.targets)

    def transition(self, current: ExecutionPlan, target: ExecutionPlan) -> PlannedTransition:
        """The planned change (:func:`nereus.transition.change.plan_change`: the DAG from the
        units alive on the pool, else the host-staged DAG, else the in-process gather-and-reload
        the runtime performs — with its estimated cost and the reason; where only a
        checkpoint/restart could make the change, the ranks still gather and reload in process:
        the removed ranks of this emulation keep running, so the state is read from them, and
        the change is priced as that). Every compilation is counted in ``compilations``."""
        if current == target:
            planned = self.base.transition(current, target)
            assert planned is not None
            return planned
        key = (current, target, self.base.pool)
        self.compilations[key] = self.compilations.get(key, 0) + 1
        alive = self.base.pool  # L̂_tran at the transition rates this run measured
        if alive is not None and self.draining:
            alive = tuple(sorted(set(alive) | set(self.draining)))
        planned = plan_change(self.base.setup, current, target, alive, self.base.calib,
                              staging=self.base.setup.job.controller.host_staging)
        if planned.executor == "restart":  # the ranks gather and reload in process instead
            return PlannedTransition.restart(
                gather_reload_s(self.base.setup, current, target, self.base.calib),
                planned.restart_reason)
        return planned


class RankZeroController:
    """Holds the controller state and the pool; every decision is plain data."""

    def __init__(self, setup: Setup, adapt: bool, static: bool = False,
                 dp_only: Iterable[str] = ()) -> None:
        """``static``: the fixed-plan baseline (verl/OpenRLHF style) — the initial TP/PP of
        every model-stage is kept and only urgent changes (lost GPUs, memory) re-fit DP on it
        (γ = 0); if the fixed layouts fit nowhere, any layout is taken. ``dp_only``: the
        model-stages whose engine runs tp = pp = 1 only (``runtime.train_engine: deepspeed``):
        every plan proposed holds them at that layout."""
        self.setup = setup
        names = set(setup.job.workflow.names)
        self.dp_only = tuple(sorted(n for n in dp_only if n in names))
        if static:
            job = replace(setup.job, controller=replace(setup.job.controller, gamma=0.0))
            self.setup = replace(setup, job=job)
        self.adapt = adapt
        self.static = static
        self.layouts: dict[str, tuple[int, int]] | None = None
        self.calib = default_calibration()
        self.state = ControllerState()
        self.pool: tuple[int, ...] = setup.cluster.all_gpus()
        self.draining: tuple[int, ...] = ()  # see CpuPort.draining
        # transitions planned since the last boundary began (see CpuPort.compilations)
        self.compilations: dict[tuple[ExecutionPlan, ExecutionPlan, tuple[int, ...] | None],
                                int] = {}
        # the calibration's window of measured samples (nereus.runtime.rank0.loop: calibrate)
        self.fit_samples: list[Sample] = []
        self.transition_samples: list[Sample] = []

    def to_dict(self) -> dict[str, Any]:
        """The controller as plain data (its replica on the other ranks; DESIGN.md §2.1): the
        policy, pinned layouts, calibration, controller state and pool."""
        return {"adapt": self.adapt, "static": self.static, "dp_only": list(self.dp_only),
                "layouts": None if self.layouts is None else {
                    k: list(v) for k, v in sorted(self.layouts.items())},
                "calibration": self.calib.to_dict(), "state": self.state.to_dict(),
                "pool": list(self.pool)}

    @staticmethod
    def from_dict(setup: Setup, d: Mapping[str, Any]) -> RankZeroController:
        """Inverse of :meth:`to_dict` on ``setup``."""
        ctl = RankZeroController(setup, bool(d["adapt"]), static=bool(d["static"]),
                                 dp_only=[str(n) for n in d.get("dp_only", [])])
        lay = d["layouts"]
        ctl.layouts = None if lay is None else {str(k): (int(v[0]), int(v[1]))
                                                for k, v in lay.items()}
        ctl.calib = Calibration.from_dict(d["calibration"])
        ctl.state = ControllerState.from_dict(d["state"])
        ctl.set_pool(int(g) for g in d["pool"])
        return ctl

    def port(self) -> CpuPort:
        return CpuPort(SearchPort(self.setup, self.calib, pool=self.pool, layouts=self.layouts),
                       tuple((n, (1, 1)) for n in self.dp_only), self.compilations,
                       self.draining)

    def initial(self) -> tuple[ExecutionPlan | None, Decision]:
        job = self.setup.job
        obs = Observation(0, float(job.gen_len), float(job.gen_len_p95 or job.gen_len),
                          self.pool)
        self.state, d = controller_step(self.state, obs, job.controller, self.port())
        if self.static and self.state.plan is not None:
            self.layouts = {sp.name: (sp.tp, sp.pp) for sp in self.state.plan.stages}
        return self.state.plan, d

    def set_pool(self, pool: Iterable[int]) -> None:
        self.pool = tuple(sorted(pool))

    def after_step(self, obs: Observation) -> Decision | None:
        """A controller pass at the step boundary (None when adaptation is off)."""
        if not self.adapt:
            return None
        before = self.state
        self.state, d = controller_step(self.state, obs, self.setup.job.controller, self.port())
        if self.static and d.urgent and not (d.admission and d.admission.admitted):
            saved, self.layouts = self.layouts, None  # the fixed layouts fit nowhere any more
            self.state, d = controller_step(before, obs, self.setup.job.controller, self.port())
            self.layouts = saved
        return d

    def forced(self, obs: Observation, layouts: Mapping[str, tuple[int, ...]],
               current: ExecutionPlan) -> tuple[ExecutionPlan, PlannedTransition] | None:
        """The best plan with ``layouts`` pinned and the transition to it from ``current`` (a
        forced transition, admission bypassed); None when no plan with them fits."""
        port = self.port()
        found = port.search(obs, layouts)
        if found is None:
            return None
        self.state = replace(self.state, plan=found[0], transitions=self.state.transitions + 1)
        return found[0], port.transition(current, found[0])


def plan_label(plan: ExecutionPlan) -> str:
    short = {"actor-gen": "gen", "ref-inf": "ref", "reward-inf": "rm", "critic-inf": "cri",
             "actor-train": "aT", "critic-train": "cT", "actor-inf": "ainf"}
    return " ".join(f"{short.get(sp.name, sp.name)}{sp.dp}.{sp.tp}.{sp.pp}" for sp in plan.stages)


def decision_dict(d: Decision) -> dict[str, Any]:
    adm = d.admission
    return {
        "step": d.step, "triggers": list(d.triggers), "urgent": d.urgent,
        "replanned": d.replanned, "lost_gpus": list(d.lost_gpus),
        "admitted": bool(adm and adm.admitted), "path": adm.path if adm else "",
        "reason": adm.reason if adm else "",
        "delta_l_s": adm.delta_l_s if adm else 0.0,
        "transition_s": adm.transition_s if adm else 0.0,
        "horizon_steps": adm.horizon_steps if adm else 0.0,
        "options": [o.to_dict() for o in adm.options] if adm else [],
    }
