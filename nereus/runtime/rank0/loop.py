"""Rank 0 at a step boundary: observe → calibrate → decide → log, then the order every rank
executes (effectful shell around the pure controller; DESIGN.md §2.1, §4).

Read :meth:`RankZero.boundary` top to bottom: each phase hands plain data to the next.

1. **observe** — the step's measurements gathered from every rank, the pool events of this
   boundary (``runtime.events``, nodes Slurm took away) applied to the pool: an
   :class:`Observed` record and the controller's :class:`~nereus.control.signals.Observation`;
2. **calibrate** — ranks that went over their device's capacity: the capacity they report and
   the memory model's per-model-stage factor, fed to the controller (:class:`Calibrated`);
3. **decide** — a forced transition (``runtime.force_transitions``) or a controller pass
   (:func:`nereus.control.controller.controller_step` through the planner port): the target and
   its :class:`~nereus.transition.PlannedTransition`, planned once (:class:`Decided`);
4. **log** — the recorder writes all of it (:mod:`nereus.runtime.rank0.recorder`);
5. **execute** — the returned :class:`PlanChangeOrder` (target plan, pool, the DAG itself or why
   there is none, and the prediction read from the same planned transition) travels to every rank
   in one message; each runs it (:func:`nereus.runtime.execution.plan_change.change_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from nereus.config.run import Event, RunConfig
from nereus.control.controller import Decision
from nereus.control.planner_port import setup_for
from nereus.control.signals import Observation
from nereus.cost.fit import Sample, fit
from nereus.cost.latency import stage_latency
from nereus.cost.memory import gpu_memory
from nereus.cost.overhead import STEP_EVENTS, step_event_counts
from nereus.cost.stage_calibration import stage_sample
from nereus.cost.workload import stage_context
from nereus.runtime.rank0.controller import RankZeroController
from nereus.runtime.rank0.recorder import RunRecorder
from nereus.spec.hardware import OpClass
from nereus.spec.plan import ExecutionPlan
from nereus.transition import PlannedTransition
from nereus.transition.cost import TRANSITION_EVENTS, transition_sample
from nereus.transition.order import PlanChangeOrder

# Samples the fit keeps: the most recent stage times (a few steps of every model-stage) and
# transitions.
STAGE_WINDOW = 48
TRANSITION_WINDOW = 12
FIT_EVENTS = (*STEP_EVENTS, *TRANSITION_EVENTS)


@dataclass(frozen=True)
class Observed:
    """Step ``step``'s measurements and this boundary's pool events."""

    step: int
    step_s: float
    stage_s: dict[str, float]
    peaks: dict[int, int]
    ooms: list[dict[str, Any]]
    r0: dict[str, Any]  # rank 0's step results: the batch-level values every rank shares
    pool_before: tuple[int, ...]
    pool: tuple[int, ...]
    events: list[tuple[str, dict[str, Any]]]  # (kind, payload) to log
    obs: Observation


@dataclass(frozen=True)
class TypeFit:
    """The calibration of one hardware type at a boundary: its model-stages' times against
    their prediction, the op-level samples derived from them, the refitted efficiencies and
    fixed costs."""

    hardware: str
    stage_times: list[tuple[str, float, float]]  # name, predicted, measured
    samples: list[tuple[str, float, float]]  # op class, ideal, measured
    efficiencies: dict[str, float]
    fixed_s: dict[str, float]


@dataclass(frozen=True)
class Calibrated:
    """What the boundary's measurements changed: the stage times against their prediction, the
    op-level samples derived from them, the refitted efficiencies and fixed costs; the OOMs'
    events and a console line."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    say: str = ""
    fits: list[TypeFit] = field(default_factory=list)  # one per hardware type the plan uses


@dataclass(frozen=True)
class Decided:
    """The boundary's decision: the controller's (``decision``) or a forced change; the order to
    execute (None: the plan stays)."""

    decision: Decision | None = None
    order: PlanChangeOrder | None = None
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    say: str = ""


class RankZero:
    """The controller rank's boundary; ``ctl`` (controller state, pool, calibration) and
    ``recorder`` (the run's record) are its state."""

    def __init__(self, ctl: RankZeroController, recorder: RunRecorder, rc: RunConfig,
                 cluster: Any = None) -> None:
        """``cluster``: Slurm allocation changes (:class:`nereus.runtime.rank0.cluster_events.
        ClusterEvents` with its node-name map), or None outside Slurm."""
        self.ctl = ctl
        self.recorder = recorder
        self.rc = rc
        self.cluster = cluster
        self.last_r0: dict[str, Any] | None = None  # the last completed step's batch values
        self.redone: set[int] = set()  # steps already redone after an out-of-memory error
        self.draining: set[int] = set()  # GPUs of drained nodes whose ranks still run

    def leaving(self, plan: ExecutionPlan) -> list[int]:
        """The ranks of drained nodes that hold no unit of ``plan`` any more: they exit at this
        boundary (their state was moved off by the plan change that left them)."""
        used = {g for sp in plan.stages for g in sp.gpus}
        out = sorted(g for g in self.draining if g not in used)
        self.draining -= set(out)
        self.ctl.draining = tuple(sorted(self.draining))
        return out

    def redo_verdict(self, step: int, gathered: list[dict[str, Any]]) -> tuple[bool, str]:
        """(whether step ``step`` stopped and is redone, why the job must end instead — it
        stopped again after its redo — or "")."""
        if not any(g.get("redo") for g in gathered):
            return False, ""
        if step in self.redone:
            fatal = [e for g in gathered for e in g["oom"] if e.get("fatal")]
            what = (f"rank {fatal[0]['global_rank']} in {fatal[0]['model_stage']}: "
                    f"{fatal[0]['detail']}") if fatal else "a rank"
            return True, (f"out of device memory in step {step} again after its urgent replan "
                          f"({what})")
        self.redone.add(step)
        return True, ""

    def boundary(self, step: int, gathered: list[dict[str, Any]], plan: ExecutionPlan
                 ) -> PlanChangeOrder | None:
        """After step ``step`` ran on ``plan``: the plan change every rank executes, or None.
        A step that stopped (a rank out of device memory, ``redo``) is not a step of the run:
        its OOMs calibrate the memory model, the controller replans (urgently, when the plan
        no longer fits) and the same step runs again."""
        self.ctl.compilations.clear()
        redo = any(g.get("redo") for g in gathered)
        seen = self.observe(step, gathered, redo)
        if redo:
            events, say = self._memory(seen, plan)
            calibrated = Calibrated(events=events, say=say)
        else:
            calibrated = self.calibrate(seen, plan)
        decided = self.decide(seen, plan, redo)
        self.log(seen, calibrated, decided, plan, redo)
        return decided.order

    # -- 1. observe --------------------------------------------------------------------------

    def observe(self, step: int, gathered: list[dict[str, Any]], redo: bool = False
                ) -> Observed:
        r0 = gathered[0]
        if redo:  # the step stopped: its batch values are those of the last completed step
            job = self.ctl.setup.job
            r0 = self.last_r0 or {**r0, "len_mean": float(job.gen_len),
                                  "len_p95": float(job.gen_len_p95 or job.gen_len)}
        else:
            self.last_r0 = r0
        step_s = max(g["step_s"] for g in gathered)
        stage_s: dict[str, float] = {}
        for g in gathered:
            for k, v in g["stage_s"].items():
                stage_s[k] = max(stage_s.get(k, 0.0), v)
        peaks = {g["rank"]: int(g["peak_bytes"]) for g in gathered}
        events: list[tuple[str, dict[str, Any]]] = []
        if self.cluster is not None:  # nodes the Slurm allocation lost: remove_node events
            lost = self.cluster.lost(self.ctl.setup.cluster.nodes)
            if lost:
                self.rc = replace(self.rc, events=self.rc.events + tuple(
                    Event(step, "remove_node", node) for node in lost.values()))
                events.append(("slurm-nodes-lost", {"nodes": list(lost),
                                                    "job": self.cluster.job_id}))
        pool_before = self.ctl.pool
        gpn = self.ctl.setup.cluster.gpus_per_node
        for ev in self.rc.events:
            if ev.at_step != step or redo:  # applied at the boundary after the step completes
                continue
            node = set(range(ev.node * gpn, (ev.node + 1) * gpn))
            pool = set(self.ctl.pool) - node if ev.kind in ("remove_node", "drain_node") \
                else set(self.ctl.pool) | node
            if ev.kind == "drain_node":  # its ranks exit once no unit is left on it
                self.draining |= node
                self.ctl.draining = tuple(sorted(self.draining))
            self.ctl.set_pool(sorted(pool))
            events.append(("gpu-pool-change", {**ev.to_dict(), "pool": list(self.ctl.pool)}))
        obs = Observation(step + 1, r0["len_mean"], r0["len_p95"], self.ctl.pool, step_s=step_s,
                          memory_violation=redo)
        return Observed(step, step_s, stage_s, peaks, [e for g in gathered for e in g["oom"]],
                        r0, pool_before, self.ctl.pool, events, obs)

    # -- 2. calibrate ------------------------------------------------------------------------

    def calibrate(self, seen: Observed, plan: ExecutionPlan) -> Calibrated:
        """Fold the step's measured stage times (and transitions measured since the last
        boundary) into the cost model, and its OOMs into the memory model."""
        events, say = self._memory(seen, plan)
        times = self._times(seen, plan)
        return replace(times, events=events, say=say)

    def _times(self, seen: Observed, plan: ExecutionPlan) -> Calibrated:
        """Each model-stage's measured time becomes a sample of the cost model's parameters
        (op-class efficiencies, fixed costs per event); the window of recent samples —
        transitions included — is refitted (:func:`nereus.cost.fit.fit`), and the next replan
        plans with the result. On a cluster of several hardware types each type is fitted on
        its own model-stages' samples (a model-stage's type: that of its first GPU; units never
        span types), costed with that type's spec."""
        ran_on = tuple(sorted({g for sp in plan.stages for g in sp.gpus}))  # the ranks busy
        s = setup_for(self.ctl.setup, Observation(seen.step, seen.r0["len_mean"],
                                                  seen.r0["len_p95"], ran_on))
        cl = s.cluster
        if not cl.heterogeneous:
            return self._fit_type(seen, plan.stages, s, "")
        from nereus.plan.hetero import typed_setup

        fits: list[TypeFit] = []
        for t in cl.types:
            stages = [sp for sp in plan.stages if sp.gpus and cl.gpu_of(sp.gpus[0]) == t]
            if stages:
                fits.extend(self._fit_type(seen, stages, typed_setup(s, t), t.name).fits)
        return Calibrated(fits=fits)

    def _fit_type(self, seen: Observed, stages: Any, s: Any, tag: str) -> Calibrated:
        """The fit of one hardware type (``s``: the setup costing it; ``tag``: its name on a
        mixed cluster, whose samples the window keeps apart; "" on one type)."""
        ctl = self.ctl
        gpu, wf, gpn = s.cluster.gpu, s.job.workflow, s.cluster.gpus_per_node
        before = ctl.calib
        stage_times: list[tuple[str, float, float]] = []
        logged: list[tuple[str, float, float]] = []
        new: list[Sample] = []
        for sp in stages:
            measured = seen.stage_s.get(sp.name, 0.0)
            if not measured > 0:
                continue
            ms = wf.by_name(sp.name)
            lat = stage_latency(s, ms, sp.candidate, before)
            counts = step_event_counts(stage_context(s, ms), sp.candidate)
            sample = stage_sample(lat, counts, measured, gpu, before,
                                  inter_node=sp.dp * sp.tp * sp.pp > gpn,
                                  contention=s.cluster.contention)
            new.append(replace(sample, label=f"{tag}:{sample.label}") if tag else sample)
            stage_times.append((sp.name, lat.total_s, measured))
            share = measured / lat.total_s if lat.total_s > 0 else 0.0
            for op_value, ideal in sample.ideal:  # the measured time, by predicted share
                inv = 1.0 / before.efficiency(gpu, OpClass(op_value))
                logged.append((op_value, ideal, ideal * inv * share))
        kinds = max(1, len(ctl.setup.cluster.types))  # each type keeps a window of its own
        ctl.fit_samples = (ctl.fit_samples + new)[-STAGE_WINDOW * kinds:]
        own = [x for x in ctl.fit_samples if not tag or x.label.startswith(f"{tag}:")]
        window = own[-STAGE_WINDOW:] + ctl.transition_samples
        inverse = {op.value: 1.0 / before.efficiency(gpu, op) for op in OpClass}
        fixed = {k: before.fixed_s(gpu, k) for k in FIT_EVENTS}
        x_inv, x_fixed = fit(window, inverse, fixed)
        effs = {k: 1.0 / v for k, v in x_inv.items()}
        ctl.calib = before.with_fit(gpu, effs, x_fixed)
        return Calibrated(fits=[TypeFit(
            gpu.name, stage_times, logged,
            {k: ctl.calib.efficiency(gpu, OpClass(k)) for k in effs},
            {k: ctl.calib.fixed_s(gpu, k) for k in x_fixed})])

    def transition_done(self, order: PlanChangeOrder, measured_s: float, executor: str,
                        moved_bytes: int) -> None:
        """A plan change ran in ``measured_s``: a sample of the transition rates
        (:func:`nereus.transition.cost.path_features`), fitted at the next boundary."""
        ctl = self.ctl
        if order.rebuilt:  # the copies' weight sync ran inside the measured time: no DAG sample
            return
        got = transition_sample(order.dag, executor, moved_bytes,
                                sum(sp.dp for sp in order.target.stages), ctl.setup.cluster,
                                ctl.calib, measured_s)
        if got is None:  # nothing measured, or a host-staged change (issue 32)
            return
        ideal, counts = got
        ctl.transition_samples = (ctl.transition_samples + [Sample(
            tuple(sorted(ideal.items())), tuple(sorted(counts.items())), measured_s,
            "transition")])[-TRANSITION_WINDOW:]

    def _memory(self, seen: Observed, plan: ExecutionPlan
                ) -> tuple[list[tuple[str, dict[str, Any]]], str]:
        """Ranks went over their capacity: give the controller the capacity the devices report
        (when it fell), and where the memory model predicted less than was measured, scale that
        model-stage's estimate up — the controller then finds the current plan infeasible and
        takes the urgent path."""
        ooms = seen.ooms
        if not ooms:
            return [], ""
        ctl = self.ctl
        events: list[tuple[str, dict[str, Any]]] = [("oom", e) for e in ooms]
        cap = min(int(e["capacity_bytes"]) for e in ooms)
        cl = ctl.setup.cluster
        hit = tuple(sorted({int(e["global_rank"]) for e in ooms}))  # their types' capacity falls
        had = min(cl.gpu_of(g).memory_bytes for g in hit)
        if cap < had:
            ctl.setup = replace(ctl.setup, cluster=cl.with_capacity(hit, cap))
            events.append(("capacity-change", {"from_bytes": had, "to_bytes": cap, **(
                {"hardware": sorted({cl.type_name(g) for g in hit})} if cl.heterogeneous
                else {})}))
        obs = Observation(0, seen.r0["len_mean"], seen.r0["len_p95"], ctl.pool)
        base = ctl.calib
        predicted = gpu_memory(setup_for(ctl.setup, obs), plan, base)
        ratio: dict[str, tuple[float, float, int]] = {}  # stage -> worst (ratio, before, peak)
        for e in ooms:
            before = predicted.get(e["global_rank"], 0) / base.memory_factor(e["model_stage"])
            if 0 < predicted.get(e["global_rank"], 0) < e["peak_bytes"]:
                r = e["peak_bytes"] / before
                if r > ratio.get(e["model_stage"], (0.0, 0.0, 0))[0]:
                    ratio[e["model_stage"]] = (r, before, int(e["peak_bytes"]))
        for name, (_, before, peak) in sorted(ratio.items()):
            # the sample is the prediction before the factor
            ctl.calib = ctl.calib.with_memory_sample(name, before, peak, 1.0)
        worst = max(ooms, key=lambda e: e["peak_bytes"] - e["capacity_bytes"])
        return events, (
            f"  OOM in step {seen.step + 1} on {len({e['global_rank'] for e in ooms})} rank(s), "
            f"e.g. rank {worst['global_rank']} in {worst['model_stage']}: "
            f"{worst['peak_bytes'] / 1e6:.1f} MB > {worst['capacity_bytes'] / 1e6:.1f} MB")

    # -- 3. decide ---------------------------------------------------------------------------

    def decide(self, seen: Observed, plan: ExecutionPlan, redo: bool = False) -> Decided:
        step, ctl = seen.step, self.ctl
        forced = [] if redo else [t for t in self.rc.force_transitions if t.at_step == step]
        if forced:
            found = ctl.forced(seen.obs, dict(forced[0].layouts), plan)
            event = ("forced-transition", {**forced[0].to_dict(), "found": found is not None})
            if found is None:
                return Decided(events=[event], say=(
                    f"  forced transition after step {step + 1}: no plan with "
                    f"{forced[0].to_dict()['layouts']} fits; plan kept"))
            target, planned = found
            return Decided(order=self._order(target, "forced", planned, plan), events=[event])
        if step >= self.rc.steps - 1 and not redo:
            return Decided()
        d = ctl.after_step(seen.obs)
        if d is None or not d.replanned:
            return Decided(decision=d)
        adm = d.admission
        if adm is not None and adm.admitted and adm.target is not None and adm.target != plan:
            assert adm.transition is not None  # admitted targets carry their transition
            return Decided(decision=d, order=self._order(adm.target, adm.path, adm.transition,
                                                         plan))
        if adm is not None and not adm.admitted and d.lost_gpus:
            # Emulation: the removed ranks are alive, so the job goes on on the current plan
            # (a real job would checkpoint and wait for the pool to change).
            return Decided(decision=d, events=[("no-feasible-plan", {"reason": adm.reason})],
                           say=f"  no plan fits the pool after step {step + 1}: {adm.reason}; "
                               "continuing on the current plan")
        return Decided(decision=d)

    def _order(self, target: ExecutionPlan, kind: str, planned: PlannedTransition,
               current: ExecutionPlan) -> PlanChangeOrder:
        key = (current, target, self.ctl.pool)
        return PlanChangeOrder.of(target, self.ctl.pool, kind, planned,
                                  self.ctl.compilations.get(key, 0))

    # -- 4. log ------------------------------------------------------------------------------

    def log(self, seen: Observed, calibrated: Calibrated, decided: Decided,
            plan: ExecutionPlan, redo: bool = False) -> None:
        rec, step = self.recorder, seen.step
        if not redo:
            rec.step(step, step_s=seen.step_s, stage_s=seen.stage_s, peaks=seen.peaks,
                     pool_gpus=len(seen.pool_before), r0=seen.r0, plan=plan)
            for tf in calibrated.fits:
                rec.calibration(step, tf.hardware, tf.stage_times, tf.samples, tf.efficiencies,
                                tf.fixed_s)
        redone = [("step-redone", {"step": step, "seconds": seen.step_s,
                                   "replan": decided.order is not None})] if redo else []
        for kind, payload in [*seen.events, *calibrated.events, *decided.events, *redone]:
            rec.event(step, kind, payload)
        if decided.decision is not None and decided.decision.replanned:
            rec.decision(step, decided.decision)
        for text in (calibrated.say, decided.say):
            if text:
                rec.say(text)
        if redo:
            rec.say(f"  step {step + 1} stopped (out of device memory) and runs again"
                    + (" on a new plan" if decided.order is not None else ""))
        else:
            rec.progress(step, seen.pool_before, seen.pool)
