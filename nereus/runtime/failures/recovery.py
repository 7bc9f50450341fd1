"""Carrying on after ranks died: the survivors rebuild the job on what is left (effectful).

``nereus run`` hands every rank a :class:`FailureHandler`. While the job runs, the handler keeps
this rank's last two safe boundaries (:mod:`nereus.runtime.failures.boundary`), a replica of the
controller (rank 0 broadcasts its controller, step rows and counters after every step, so any
survivor can take over) and writes the periodic checkpoint. When a step or a plan change raises
on a rank, the worker calls :meth:`FailureHandler.survive` on every survivor:

1. revoke and shrink the MPI communicator (:func:`nereus.runtime.failures.ulfm.shrink`); nobody lost →
   the error is fatal as before;
2. drop the data plane: this plan's units and the torch.distributed default group (its peers
   may be dead; the next generation gets a new store file, :mod:`nereus.runtime.mpi.rendezvous`);
3. renumber: the survivors are GPUs ``0..n-1`` of a smaller virtual cluster in their old order
   (so GPU id = MPI rank = torch rank again, and whole surviving nodes stay whole nodes);
4. agree on a boundary and assemble every model-stage's global state from a replica that
   survived; a frozen copy whose trained source survived (actor-gen ← actor-train,
   critic-inf ← critic-train) is rebuilt from it; anything else lost → the newest checkpoint
   (``runtime.failures.checkpoint_every``), or one clear error when there is none;
5. the lowest survivor (rank 0 of the new communicator) becomes the controller and replans on
   the urgent path for the surviving pool.

The worker then runs the rest of the job from that boundary on the new plan: a new rendezvous
generation hosted by the lowest survivor, new units, the same step loop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nereus.runtime.failures.boundary import (
    BoundaryBook,
    agree_boundary,
    gather_survivors,
    take_boundary,
)
from nereus.runtime.failures.checkpoint import latest_global, save_global
from nereus.runtime.failures.restart import RestartPoint
from nereus.runtime.failures.ulfm import RankFailure, shrink, ulfm_enabled
from nereus.runtime.mpi.frames import bcast
from nereus.runtime.worker.state import FIELDS, Counters
from nereus.spec.job import Setup
from nereus.spec.plan import ExecutionPlan


def fill_copies(setup: Setup, globs: dict[str, Any], lost: Sequence[str]) -> list[str]:
    """Give every lost frozen copy of a trained model-stage (actor-gen, critic-inf:
    :meth:`nereus.spec.workflow.Workflow.copy_source`) whose source was not lost its source's
    parameters (equal after every step's weight sync, the boundary the survivors agree on) and
    zero other fields, in ``globs``; the model-stages still lost."""
    wf = setup.job.workflow
    still = []
    for name in lost:
        src = wf.copy_source(name)
        if src is None or src in lost or src not in globs:
            still.append(name)
            continue
        param = globs[src]["param"]
        globs[name] = {f: {t: (a if f == "param" else a * 0) for t, a in param.items()}
                       for f in FIELDS}
    return still


@dataclass
class Resume:
    """What the survivors carry into the rest of the job."""

    setup: Setup  # on the survivors' renumbered cluster
    rc: Any  # RunConfig with events renumbered
    plan: ExecutionPlan
    globs: dict[str, Any]
    counters: dict[str, tuple[Counters, float]]
    step: int  # the next step to run
    generation: int
    ctl: Any = None  # RankZeroController on the new rank 0
    recorder: Any = None  # RunRecorder on the new rank 0
    event: dict[str, Any] = field(default_factory=dict)  # logged once the units exist
    t_detect: float = 0.0  # time.time() when this rank saw the failure
    # growth through the transition DAG (nereus.runtime.mpi.growth): the plan the old ranks
    # ran, the order whose DAG extends it onto the joined ranks, this rank's own shards of it
    source: ExecutionPlan | None = None
    order: Any = None
    local: dict[Any, Any] = field(default_factory=dict)


def survivor_setup(setup: Setup, alive: tuple[int, ...]) -> tuple[Setup, dict[int, int]]:
    """The setup on the survivors renumbered ``0..n-1`` (in old order), and old → new ids."""
    gpn = setup.cluster.gpus_per_node
    renumber = {old: new for new, old in enumerate(sorted(alive))}
    nodes = -(-len(alive) // gpn)
    return replace(setup, cluster=replace(setup.cluster, nodes=nodes)), renumber


def surviving_node_map(setup: Setup, renumber: dict[int, int]) -> dict[int, int]:
    """Old node → new node, for nodes all of whose GPUs survived."""
    gpn = setup.cluster.gpus_per_node
    out = {}
    for node in range(setup.cluster.nodes):
        gpus = range(node * gpn, (node + 1) * gpn)
        if all(g in renumber for g in gpus):
            out[node] = renumber[node * gpn] // gpn
    return out


class FailureHandler:
    """Per-rank failure bookkeeping for ``nereus run`` (see the module docstring)."""

    def __init__(self, comm: Any, log_path: str) -> None:
        from nereus.runtime.failures.preemption import PreemptWatch

        self.enabled = ulfm_enabled(comm)
        self.preempt = PreemptWatch()  # installed by the worker before any thread starts
        self.drained: list[int] = []  # ranks of drained nodes that left (nereus...failures.drain)
        self.restart: RestartPoint | None = None  # a resumed run's starting state
        self.segment = ""  # this run segment's name (rank 0's, told with the first plan)
        self.fingerprint: Any = None  # the job's (nereus.config.fingerprint), set at start
        self.log_path = log_path
        self.original = tuple(range(comm.Get_size()))  # current rank → original global rank
        self.generation = 0
        self.book = BoundaryBook()
        self.replica: dict[str, Any] | None = None  # rank 0's controller and record, as data
        self.resume: Resume | None = None
        self.units: Any = None
        self.setup: Setup | None = None
        self.rc: Any = None
        self.cfg: Any = None
        self.ctl: Any = None
        self.recorder: Any = None
        self.version = 0
        self.leader = False  # rank 0 of the survivors (after a failure)
        self.leader_known = False  # False until the survivors have a communicator
        self._armed: set[tuple[int, str]] = set()
        self._due: dict[tuple[int, str], threading.Event] = {}
        self._kill_lock = threading.Lock()  # an injected death either happens or never will
        self._disarmed = False
        self._cluster: Any = None  # ClusterEvents under Slurm (rank 0), False elsewhere

    # -- while the job runs ------------------------------------------------------------------

    def watch(self, setup: Setup, rc: Any, cfg: Any, ctl: Any, recorder: Any) -> None:
        self.setup, self.rc, self.cfg, self.ctl, self.recorder = setup, rc, cfg, ctl, recorder

    def start_state(self, globs: dict[str, Any]
                    ) -> tuple[dict[str, Any], dict[str, tuple[Counters, float]], int]:
        """(global state, counters, first step): the survivors' boundary after a failure, the
        newest checkpoint of ``failures.resume``, or ``globs`` (the initial state) at step 0."""
        if self.resume is not None:
            return self.resume.globs, self.resume.counters, self.resume.step
        ck = self.restart
        if ck is not None:
            if self.recorder is not None:
                log = self.recorder.log
                redone = list(range(ck.step, log.last_step + 1))  # logged, run again: the
                log.log_event(max(ck.step - 1, 0), "restart",  # reader keeps the later rows
                              {**ck.event(), **({"redone_steps": redone} if redone else {})})
                history = ck.history
                if history is not None:  # the summary goes on from the checkpointed run's
                    r = self.recorder
                    r.rows = [row for row in history["rows"] if row["step"] < ck.step]
                    r.transitions = int(history["transitions"])
                    r.transition_s = float(history["transition_s"])
            return ck.globs, ck.counters, ck.step
        return globs, {}, 0

    def restart_dir(self, resume_arg: str) -> str:
        """Where a resumed run's state is (``--resume DIR``, or a relaunch's
        ``runtime.failures.resume``); "" for a fresh run."""
        return resume_arg or (self.rc.failures.resume if self.rc is not None else "")

    def boundary(self, units: Any, step: int, version: int) -> None:
        """Record the state before ``step`` on plan ``version`` (once per key)."""
        self.units, self.version = units, version
        if not self.book.kept or self.book.latest() != (step, version):
            self.book.record(take_boundary(units, step, version))

    def replicate(self, plane: Any) -> None:
        """Rank 0 sends its controller, step rows and counters (plain data); the others keep
        them."""
        data = None
        if plane.is_root and self.ctl is not None and self.recorder is not None:
            r = self.recorder
            data = {"controller": self.ctl.to_dict(), "rows": r.rows,
                    "transitions": r.transitions, "transition_s": r.transition_s}
        self.replica = bcast(plane.comm, data, plane.root, "replica")

    def cluster_watch(self) -> Any:
        """Rank 0 under Slurm: the watch of the allocation
        (:class:`nereus.runtime.rank0.cluster_events.ClusterEvents`, kept across recoveries so
        a node is reported lost once), else None."""
        if self._cluster is None:
            from nereus.runtime.rank0.cluster_events import cluster_events

            self._cluster = cluster_events(os.environ) or False
        return self._cluster or None

    def checkpoint(self, plane: Any, step: int, force: bool = False) -> str:
        """Every ``checkpoint_every`` steps (or now, ``force``: a preemption): the state before
        ``step``, written by rank 0 with the plan it is on and the controller (collective).
        Returns the file's path on rank 0, else ""."""
        every = self.rc.failures.checkpoint_every
        if not force and (not every or step % every or step >= self.rc.steps):
            return ""
        assert self.setup is not None
        b = self.book.at((step, self.version))
        globs, counters, _ = gather_survivors(self.setup, b, plane.comm,
                                              self.setup.cluster.all_gpus())
        if plane.is_root:
            r = self.recorder
            history = None if r is None else {
                "rows": [row for row in r.rows if row["step"] < step],
                "transitions": r.transitions, "transition_s": r.transition_s}
            extra = {"plan": b.plan.to_dict(), "log": self.log_path, "segment": self.segment,
                     "controller": None if self.ctl is None else self.ctl.to_dict(),
                     **self._job()}
            path = save_global(self.checkpoint_dir(), step, globs, counters, history, extra)
            if r is not None:
                r.log.log_event(max(step - 1, 0), "checkpoint", {"path": path, "step": step})
            return path
        return ""

    def dump(self, rank: int, reason: str) -> None:
        """A preempted rank abandons its step (from the watch thread): its shards of the last
        two boundaries to the checkpoint directory; rank 0 adds the controller and the record,
        logs ``preempted`` and closes the run log."""
        from nereus.runtime.failures.dumps import write_rank_dump

        extra: dict[str, Any] = {}
        r = self.recorder
        if self.ctl is not None and r is not None:
            extra = {"controller": self.ctl.to_dict(),
                     "history": {"rows": list(r.rows), "transitions": r.transitions,
                                 "transition_s": r.transition_s}}
        kept = list(self.book.kept)
        path = write_rank_dump(self.checkpoint_dir(), self.segment or "0", rank, kept, extra,
                               reason, job={"log": self.log_path, **self._job()})
        if r is not None:
            notice = self.preempt.notice
            with contextlib.suppress(Exception):
                r.log.log_event(max(kept[-1].step - 1, 0) if kept else 0, "preempted", {
                    "abandoned": True, "reason": reason, "dump": os.path.dirname(path),
                    "boundaries": [b.step for b in kept],
                    **({} if notice is None else notice.to_dict())})
                r.log.close()

    def _job(self) -> dict[str, Any]:
        """What every checkpoint and dump records of the job: its fingerprint."""
        return {} if self.fingerprint is None else {"fingerprint": self.fingerprint.to_dict()}

    def checkpoint_dir(self) -> str:
        return self.rc.failures.checkpoint_dir or f"{self.log_path}.ckpt"

    def _track(self, size: int) -> None:
        """Ranks that joined later (growth) keep their id at joining as their original id."""
        if len(self.original) < size:
            self.original += tuple(range(len(self.original), size))

    def arm(self, rank: int, step: int, phase: str) -> None:
        """Injected deaths: every rank of the chosen original node kills itself (SIGKILL)
        ``after_s`` into the step or plan change, or when :meth:`due` says it ended."""
        if self.rc is None or (step, phase) in self._armed:
            return
        self._track(rank + 1)
        assert self.setup is not None
        gpn = self.setup.cluster.gpus_per_node
        kills = self.rc.failures.kills_at(self.original[rank] // gpn, step, phase)
        if not kills:
            return
        self._armed.add((step, phase))
        delay_s, path = kills[0].after_s, f"{self.log_path}.kills"
        with_runtime = kills[0].runtime
        now = threading.Event()
        self._due[(step, phase)] = now

        def die() -> None:
            now.wait(delay_s)  # the moment, or the end of the step / plan change
            self._kill_lock.acquire()  # held until the process dies: disarm() waits for it
            if self._disarmed:
                self._kill_lock.release()
                return
            with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as fh:
                fh.write(f"{self.original[rank]} {time.time():.6f}"
                         f"{' runtime' if with_runtime else ''}\n")
            if with_runtime:  # the rank's MPI daemon dies with its node: the job ends
                with contextlib.suppress(OSError):
                    os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=die, daemon=True).start()

    def due(self, step: int, phase: str) -> None:
        """This rank's part of step ``step`` (or of the plan change after it) ended: a death
        armed for it that has not fired yet fires now, before anything of it is reported."""
        now = self._due.pop((step, phase), None)
        if now is None:
            return
        now.set()
        while not self._disarmed:  # the armed thread ends this process
            time.sleep(0.05)

    def disarm(self) -> None:
        """The run's work is done: an injected death not yet fired never fires (one that is
        firing ends this process before this returns), so the final agreement sees every
        death that was stamped."""
        with self._kill_lock:
            self._disarmed = True

    # -- after a failure ---------------------------------------------------------------------

    def survive(self, comm: Any, rank: int, exc: BaseException) -> tuple[Any, Resume] | None:
        """Every survivor: the survivors' communicator and what to resume, or None when no rank
        died (the error is then this job's own, and fatal)."""
        if not self.enabled or self.units is None or self.setup is None:
            return None
        t_detect = time.time()
        self.leader = self.leader_known = False  # a leader of an earlier recovery may be dead
        self._track(comm.Get_size())
        surv = shrink(comm, rank, tuple(range(comm.Get_size())))
        if not surv.lost:
            return None
        if self.rc is not None and self.rc.zero_stages:
            # The boundary copies hold a ZeRO unit's parameters, not its partitioned Adam
            # moments: rebuilding from them would silently reset the optimizer. End instead.
            raise RankFailure(f"ranks {list(surv.lost)} died; the DeepSpeed engine's ZeRO "
                              "partitions cannot be rebuilt from the survivors, so the job ends "
                              "(its log is kept; runtime.train_engine: megatron survives deaths)")
        import torch.distributed as dist

        with contextlib.suppress(Exception):
            self.units.destroy()
        self.units = None
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        new_comm = surv.comm
        if list(surv.gpus) != sorted(surv.gpus):  # no leader: each survivor reports
            raise RankFailure(f"Comm.Shrink reordered the survivors: {surv.gpus}")
        is_root = self.leader = new_comm.Get_rank() == 0
        self.leader_known = True
        b = agree_boundary(self.book, new_comm)
        setup, renumber = survivor_setup(self.setup, surv.gpus)
        lost_original = [self.original[g] for g in surv.lost]
        self.original = tuple(self.original[g] for g in sorted(surv.gpus))
        globs, counters, lost = gather_survivors(self.setup, b, new_comm, surv.gpus)
        lost = fill_copies(self.setup, globs, lost)
        step, restored, lost_stages = b.step, "replicas", list(lost)
        if lost:
            from nereus.runtime.failures.resume_check import expected_for

            ck = latest_global(self.checkpoint_dir(),
                               expected_for(self.setup, self.fingerprint))
            if ck is None:
                raise RankFailure(
                    f"ranks {lost_original} died with every replica of {', '.join(lost)} and "
                    "there is no checkpoint to resume from (set runtime.failures.checkpoint_every)")
            restored, step, globs, counters = ck[0], ck[1], ck[2], ck[3]
        node_map = surviving_node_map(self.setup, renumber)
        rc = replace(self.rc, events=tuple(replace(e, node=node_map[e.node])
                                           for e in self.rc.events if e.node in node_map))
        self.generation += 1
        res = Resume(setup, rc, b.plan, globs, counters, step, self.generation,
                     event={"lost_stages": lost_stages}, t_detect=t_detect)
        err, plan_d = "", None
        if is_root:
            try:
                plan_d = self._take_over(res, renumber, lost_original, restored, surv.shrink_s)
            except RankFailure as e:  # told to every survivor below
                err = str(e)
            except Exception as e:
                err = f"{type(e).__name__}: {e}"
        told = bcast(new_comm, {"plan": plan_d, "error": err}, 0, "survive")
        plan_d, err = told["plan"], str(told["error"])
        if err:
            raise RankFailure(err)
        res.plan = ExecutionPlan.from_dict(plan_d)
        self.book = BoundaryBook()
        self.resume = res
        return new_comm, res

    def close_log(self, error: str) -> None:
        """Rank 0: close the run log as failed (the job ends without finishing)."""
        if self.recorder is not None:
            with contextlib.suppress(Exception):
                self.recorder.log.close(clean=False, error=error)

    def _take_over(self, res: Resume, renumber: dict[int, int], lost_original: list[int],
                   restored: str, shrink_s: float) -> dict[str, Any]:
        """Rank 0 of the survivors: the controller (from the replica when rank 0 died) replans
        on the urgent path for the surviving pool; the run log carries on."""
        from nereus.control.controller import ControllerState, controller_step
        from nereus.control.signals import Observation
        from nereus.runtime.rank0.controller import RankZeroController, decision_dict
        from nereus.runtime.rank0.recorder import RunRecorder

        old, recorder = self.ctl, self.recorder
        rows, transitions, transition_s = (recorder.rows, recorder.transitions,
                                           recorder.transition_s) if recorder else ([], 0, 0.0)
        assert self.setup is not None
        if old is None and self.replica is None:  # rank 0 died before its first replica
            old = RankZeroController(self.setup, self.rc.adapt,
                                     static=self.rc.policy == "static")
            old.initial()  # the fixed layouts of the static policy, as rank 0 had them
        elif old is None and self.replica is not None:  # rank 0 died: its last replica
            rep = self.replica
            old = RankZeroController.from_dict(self.setup, rep["controller"])
            rows, transitions, transition_s = (list(rep["rows"]), int(rep["transitions"]),
                                               float(rep["transition_s"]))
        completed = len(rows)
        rows = [r for r in rows if r["step"] < res.step]
        ctl = RankZeroController(res.setup, old.adapt, static=old.static)
        ctl.calib, ctl.layouts = old.calib, old.layouts
        ctl.fit_samples = list(getattr(old, "fit_samples", []))
        ctl.transition_samples = list(getattr(old, "transition_samples", []))
        ctl.set_pool([renumber[g] for g in old.pool if g in renumber])
        last = rows[-1] if rows else None
        job = res.setup.job
        obs = Observation(res.step, last["len"] if last else float(job.gen_len),
                          last["len"] if last else float(job.gen_len_p95 or job.gen_len),
                          ctl.pool)
        ctl.state, d = controller_step(ControllerState(), obs, ctl.setup.job.controller,
                                       ctl.port())
        if ctl.state.plan is None and ctl.layouts is not None:
            ctl.layouts = None  # the fixed layouts fit nowhere on the survivors
            ctl.state, d = controller_step(ControllerState(), obs, ctl.setup.job.controller,
                                           ctl.port())
        if ctl.state.plan is None:
            reason = d.admission.reason if d.admission else "no plan"
            raise RankFailure(f"ranks {lost_original} died and no plan fits the "
                              f"{len(ctl.pool)} surviving ranks: {reason}")
        if recorder is None:
            base, ext = os.path.splitext(self.log_path)
            recorder = RunRecorder(f"{base}.after-failure-{res.generation}{ext or '.h5'}",
                                   res.setup, res.rc, self.cfg, ctl.state.plan)
        recorder.rows, recorder.transitions = rows, transitions
        recorder.transition_s = transition_s
        recorder.setup, recorder.rc = res.setup, res.rc
        res.ctl, res.recorder = ctl, recorder
        res.event = {**res.event, "lost_ranks": lost_original, "survivors": list(self.original),
                     "resume_step": res.step, "steps_lost": max(0, completed - res.step),
                     "restored_from": restored, "shrink_s": shrink_s,
                     "decision": decision_dict(d), "log": self.log_path,
                     "drained": bool(self.drained)}  # ranks that exited on notice, not died
        return ctl.state.plan.to_dict()

    def resumed(self, plan: ExecutionPlan, globs: dict[str, Any], change: Any = None) -> None:
        """Rank 0, once the survivors' units exist: log the failure and the urgent change
        (``change``: the PlanChange of a growth whose DAG ran)."""
        res = self.resume
        if res is None or res.recorder is None:
            return
        moved_bytes = sum(int(a.nbytes) for g in globs.values() for d in g.values()
                          for a in d.values())
        from nereus.runtime.rank0.controller import plan_label

        now = time.time()
        ev = {**res.event, "detect_unix_s": res.t_detect, "resumed_unix_s": now,
              "recover_s": now - res.t_detect}
        rec = res.recorder
        step = max(res.step - 1, 0)
        if ev.get("kind") == "growth":  # late nodes' ranks joined (nereus.runtime.mpi.growth)
            rec.log.log_event(step, "gpu-pool-growth", ev)
            if change is not None and change.executor == "dag":
                rec.transition(step, {"kind": "growth", "predicted_s": res.order.predicted_s},
                               plan, now - res.t_detect, change.bytes_moved, [],
                               executor="dag", primitives=change.primitives,
                               dag_detail={"reason": "", "waves": change.waves,
                                           "compilations": res.order.compilations})
            else:
                rec.transition(step, {"kind": "growth", "predicted_s": 0.0}, plan,
                               now - res.t_detect, moved_bytes, [], executor="gather-reload",
                               dag_detail={"reason": f"no transition DAG ({ev.get('reason')}): "
                                                     "the units were rebuilt from the gathered "
                                                     "state"})
            rec.console.print(f"  ranks {ev['joined_ranks']} joined: resume at step "
                              f"{res.step + 1} on {plan_label(plan)} ({ev['recover_s']:.2f} s)")
            return
        rec.log.log_event(step, "rank-failure", ev)
        # The survivors' plan: an urgent replan (any executable plan, profitability waived).
        rec.log.log_replan(step, "rank-failure", ev["decision"], 0.0, None)
        rec.log.log_admission(step, True, "urgent", f"ranks {ev['lost_ranks']} died", 0.0,
                              now - res.t_detect, 0.0)
        if ev["restored_from"] != "replicas":
            rec.log.log_event(step, "restart", {"from_checkpoint": ev["restored_from"],
                                                "step": res.step})
        rec.transition(step, {"kind": "urgent", "predicted_s": 0.0}, plan, now - res.t_detect,
                       moved_bytes, [])
        how = "of drained nodes exited" if ev.get("drained") else "died"
        rec.console.print(f"  ranks {ev['lost_ranks']} {how}: {len(ev['survivors'])} survivors "
                          f"resume at step {res.step + 1} on {plan_label(plan)} "
                          f"(state from {ev['restored_from']}, {ev['recover_s']:.2f} s)")
