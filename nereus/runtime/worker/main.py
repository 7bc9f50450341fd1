"""The rank program of ``nereus run``: ``python -m nereus.runtime.worker.main --config C --log L``.

Every rank parses the same config (deterministic), joins the MPI control plane and the
torch.distributed rendezvous whose job-private store file rank 0 announces on it
(:mod:`nereus.runtime.mpi.rendezvous`: nothing listens for it). Rank 0 runs the controller and
also works as a rank (see ``nereus.runtime.rank0.controller``). Per step: rank 0 broadcasts a
versioned ``step`` message, every rank runs the step on its units, measurements are gathered to
rank 0, which logs them, applies injected events, runs the controller and broadcasts a ``plan``
message (the target plan or none). An admitted target is installed at this safe boundary through
``nereus.runtime.execution.gather_reload`` and the next step runs on it.

Failures: start-up problems are agreed on by every rank (the same error everywhere, exit 2 or 3);
a rank whose own code fails mid-run prints ``NEREUS-RANK-ERROR rank R: …`` on stderr and aborts
the MPI job, so no rank waits forever (every gloo collective also has a timeout). When ranks
*die* (under ULFM, ``mpiexec --with-ft ulfm``), the survivors shrink the communicator and run the
rest of the job on what is left (``nereus.runtime.failures.recovery``): ``_run`` starts again on
the survivors from the agreed boundary, with the replicated controller on the lowest survivor.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any

from nereus.runtime.worker.binding import agreed, bind_device, devices_event, max_over_ranks

ERROR_MARK = "NEREUS-RANK-ERROR"
EXIT_CONFIG, EXIT_INFEASIBLE, EXIT_RANK = 2, 3, 4


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="nereus.runtime.worker.main")
    p.add_argument("--config", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--ranks", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--summary-json", default="")
    p.add_argument("--host-cores", type=int, default=0,
                   help="cores the ranks share on this host (set by nereus run's local launch)")
    p.add_argument("--resume", default="", metavar="DIR",
                   help="start from the newest checkpoint in DIR and continue the log")
    p.add_argument("--rendezvous-dir", default="",
                   help="the job's private store folder (set by nereus run; else rank 0 makes one)")
    return p.parse_args(argv)


def _die_with_parent() -> None:
    """Die when the process that started this rank dies — Open MPI's daemon, or srun's step
    daemon — as the ranks of a lost node do; no orphaned rank keeps running after its MPI
    runtime is gone (Linux ``PR_SET_PDEATHSIG``; elsewhere nothing)."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if __name__ == "__main__":  # started by a launcher, not called in-process
        _die_with_parent()
    from nereus.runtime.failures.preemption import PreemptWatch

    watch = PreemptWatch()
    watch.install()  # before torch, gloo or MPI start a thread: they never see the signals
    import torch

    torch.set_num_threads(1)
    from mpi4py import MPI

    from nereus.errors import CommunicationError
    from nereus.runtime.failures.recovery import FailureHandler
    from nereus.runtime.failures.ulfm import RankFailure, secondary
    from nereus.runtime.mpi.frames import FrameError
    from nereus.runtime.mpi.growth import Grown, Links, join_parent, joined
    from nereus.runtime.mpi.plane import ControlPlane
    from nereus.runtime.mpi.rendezvous import StoreFolder, finish

    links = Links()
    comm = join_parent(links) or MPI.COMM_WORLD  # spawned for a late node: the merged job
    plane = ControlPlane(comm)
    ft = FailureHandler(comm, args.log)
    ft.preempt = watch
    devices: list[Any] = []  # the RankDevice of each attempt: its communicators to abort
    folder = StoreFolder(args.rendezvous_dir)  # a spawned rank learns it at its rendezvous
    if links.pairs:  # the job's setup as the config gives it (see growth.joined)
        joined(comm, ft, _configure(args, None)[2])
    while True:
        try:
            code = _run(args, comm, plane, ft, folder, devices)
            finish(comm, folder, plane.is_root)
            grown = bool(links.pairs)
            links.release()
            if ft.enabled and not grown:  # ULFM: with a dead rank MPI_Finalize can wait forever
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            return code
        except Grown as g:  # late nodes' ranks joined: the rest of the job on the merged comm
            links.pairs.append((g.comm, g.inter))
            comm, plane = g.comm, ControlPlane(g.comm)
            continue
        except Exception as e:  # agreed error, ranks died (survive, go on), or this rank failed
            failed: Exception = e
            for dev in devices:  # no rank may keep waiting in a device communicator
                dev.abort()
            devices.clear()
            if (isinstance(e, CommunicationError) and not isinstance(e, FrameError)
                    and ft.units is None):  # agreed at start-up (a torn frame is not agreed)
                code = _agreed_error(plane, e)
                finish(comm, folder, plane.is_root)
                return code
            try:
                survived = ft.survive(comm, plane.global_rank, e) if secondary(e) else None
            except RankFailure as lost:  # survivors, but state or plan lost: one line, exit
                if ft.leader or not ft.leader_known:  # before the survivors had a leader: each
                    _report(args, plane.global_rank, f"RankFailure: {lost}")
                ft.close_log(str(lost))
                if ft.leader:
                    folder.remove()
                sys.stderr.flush()
                os._exit(EXIT_RANK)  # MPI_Finalize waits forever here with a dead rank
            if survived is None:
                break
            comm = survived[0]
            plane = ControlPlane(comm)
    # A failure of this rank's own (or nobody died): tell, then end every rank.
    first = str(failed).splitlines()[0] if str(failed) else ""
    _report(args, plane.global_rank, f"{type(failed).__name__}: {first}")
    time.sleep(0.5)  # let mpiexec forward the line before the abort tears the job down
    folder.remove()  # the abort ends every rank: none uses the store any more
    comm.Abort(EXIT_RANK)
    return EXIT_RANK


def _agreed_error(plane: Any, e: Exception) -> int:
    """Every rank has the same message (``ControlPlane.agree``): rank 0 prints it."""
    text = str(e)
    kind = text.split(": ", 1)[1].split("|", 1)[0] if "|" in text else ""
    msg = text.split("|", 1)[1] if "|" in text else text
    if plane.is_root:
        prefix = "infeasible" if kind == "InfeasiblePlanError" else "error"
        print(f"nereus: {prefix}: {msg}", file=sys.stderr, flush=True)
    if kind == "InfeasiblePlanError":
        return EXIT_INFEASIBLE
    return EXIT_CONFIG if kind == "ConfigError" else EXIT_RANK


def _report(args: argparse.Namespace, rank: int, detail: str) -> None:
    """The one error line of a rank (and a copy beside the summary: MPI_Abort can cut the
    stderr forwarding)."""
    print(f"{ERROR_MARK} rank {rank}: {detail}", file=sys.stderr, flush=True)
    if args.summary_json:
        err_path = os.path.join(os.path.dirname(args.summary_json), f"rank-error-{rank}.txt")
        with contextlib.suppress(OSError), open(err_path, "w", encoding="utf-8") as fh:
            fh.write(f"rank {rank}: {detail}\n")


def _configure(args: argparse.Namespace, detected: Any) -> tuple[Any, Any, Any, Any]:
    """(config, run options, setup, inputs) of the job, as every rank reads them (``detected``:
    the GPU ``cluster.gpu: auto`` stands for, as rank 0 found it, or None); the setup plans
    the data's prompt length (:func:`nereus.rl.inputs.load_inputs`)."""
    from nereus.config.load import load_config
    from nereus.config.run import parse_runtime
    from nereus.rl.inputs import load_inputs

    cfg = load_config(args.config, detect_gpu=None if detected is None else lambda: detected)
    rc, setup = parse_runtime(cfg.section("runtime"), cfg.setup, ranks=args.ranks,
                              steps=args.steps, host_cores=args.host_cores)
    inputs, setup = load_inputs(cfg, args.config, rc, setup)
    return cfg, rc, setup, inputs


def _run(args: argparse.Namespace, comm: Any, plane: Any, ft: Any, folder: Any,
         devices: list[Any] | None = None) -> int:
    from dataclasses import asdict

    import torch.distributed as dist

    from nereus.cluster.transport import summed
    from nereus.engines.vllm_engine import require_vllm
    from nereus.errors import ConfigError, InfeasiblePlanError
    from nereus.runtime.execution.gather_reload import gather_state
    from nereus.runtime.execution.plan_change import change_plan
    from nereus.runtime.failures.restart import load_restart, restored_controller
    from nereus.runtime.failures.resume_check import expected_for, run_fingerprint
    from nereus.runtime.mpi import frames
    from nereus.runtime.mpi.plane import Message
    from nereus.runtime.mpi.rendezvous import rendezvous
    from nereus.runtime.rank0.controller import RankZeroController
    from nereus.runtime.rank0.loop import RankZero
    from nereus.runtime.rank0.recorder import RunRecorder
    from nereus.runtime.worker.heap import settle
    from nereus.runtime.worker.hf_run import HfRun
    from nereus.runtime.worker.host_memory import reserve, retain_freed_memory
    from nereus.runtime.worker.memory import account_for_run
    from nereus.runtime.worker.step import Rollout, StepInputs, run_async_step, run_step
    from nereus.runtime.worker.units import PlanUnits
    from nereus.spec.hardware import GpuSpec
    from nereus.spec.plan import ExecutionPlan
    from nereus.transition.order import PlanChangeOrder

    rank = plane.global_rank

    def detect() -> Any:  # cluster.gpu: auto — the hardware of rank 0's node, for every rank
        from nereus.config.cluster import uses_auto_gpu
        from nereus.config.load import load_raw

        if not plane.is_root or not uses_auto_gpu(load_raw(args.config)):
            return None
        from nereus.cluster.probe import detected_gpu

        return detected_gpu()

    found = agreed(plane, detect)
    detected = frames.bcast(comm, None if found is None else asdict(found), 0, "gpu")
    detected = None if detected is None else GpuSpec(**detected)

    def setup_all() -> Any:
        cfg, rc, setup, inputs = _configure(args, detected)
        require_vllm(rc.generation)
        if rc.train_engine == "deepspeed":  # imports, and DeepSpeed accepts its config
            from nereus.engines.deepspeed_engine import check_config, require_deepspeed

            require_deepspeed(rc.train_engine)
            check_config(_zero_options(rc))
        if rc.start_ranks != plane.world_size and ft.resume is None:
            raise ConfigError("--ranks", plane.world_size, f"the MPI job has {plane.world_size} "
                              f"ranks, the config starts {rc.start_ranks}")
        return cfg, rc, setup, inputs

    cfg, rc, setup, inputs = agreed(plane, setup_all)
    hf = agreed(plane, lambda: HfRun(cfg, rc, setup, inputs.codec))  # checkpoints, exports
    ft.preempt.configure(rc.failures.warning_s, rc.failures.kill_wait_s)
    ft.fingerprint = run_fingerprint(cfg, rc, inputs.fingerprint())  # checkpoints, dumps, logs
    if ft.resume is not None:  # survivors of dead ranks: a smaller cluster, renumbered
        setup, rc = ft.resume.setup, ft.resume.rc
    elif ft.restart is None and (args.resume or rc.failures.resume):
        expect = expected_for(setup, ft.fingerprint, args.log if args.resume else "")
        ft.restart = agreed(plane, lambda: load_restart(
            args.resume or rc.failures.resume, setup, expect,
            "--resume" if args.resume else "runtime.failures.resume"))
    dev, rc = bind_device(plane, comm, rc, setup)
    if devices is not None:
        devices.append(dev)

    def maybe_fail(at_step: int) -> None:
        if rc.inject_failure == (rank, at_step):
            raise RuntimeError(f"injected failure (runtime.inject_failure) at step {at_step}")

    maybe_fail(-1)
    ctl = (RankZeroController(setup, rc.adapt, static=rc.policy == "static",
                              dp_only=rc.zero_stages) if plane.is_root else None)
    if ctl is not None:
        ctl.set_pool(range(plane.world_size))  # late nodes (runtime.late_nodes) join later
    kept_plan = None  # a resumed run's plan, when it still fits this allocation
    if ctl is not None and ft.resume is None and ft.restart is not None:
        ctl, kept_plan = restored_controller(ctl, ft.restart, setup)
    if ft.resume is not None:
        ctl = ft.resume.ctl
    recorder: RunRecorder | None = None

    def first_plan() -> Any:
        assert ctl is not None
        plan, d = ctl.initial()
        if plan is None:
            reason = d.admission.reason if d.admission else "no plan"
            raise InfeasiblePlanError(f"no plan fits the virtual cluster: {reason}")
        return plan

    plan_d = agreed(plane, lambda: (ft.resume.plan.to_dict() if ft.resume else kept_plan or
                                    first_plan().to_dict()) if plane.is_root else None)
    told = plane.broadcast(Message("plan", plane.next_seq(), {
        "plan": plan_d, "segment": f"{int(time.time())}-{os.getpid()}"})
        if plane.is_root else None, "plan").payload
    plan = ExecutionPlan.from_dict(told["plan"])
    ft.segment = ft.segment or str(told["segment"])
    if plane.is_root:
        recorder = agreed(plane, lambda: ft.resume.recorder if ft.resume else
                          RunRecorder(args.log, setup, rc, cfg, plan,
                                      append=_continues(args, ft), fingerprint=ft.fingerprint))
    else:
        agreed(plane, lambda: None)

    from nereus.cluster.transport import default_backend

    rendezvous(plane, folder, ft.generation,
               backend=default_backend(dev.placements), timeout_s=rc.timeout_s,
               shared_parent=os.path.dirname(os.path.abspath(args.log)))
    if recorder is not None:
        recorder.event(0, "devices", devices_event(dev, rc))
        recorder.data(inputs.summary())
    from datetime import timedelta

    from nereus.engines.megatron_model import StageGroups

    store = dist.distributed_c10d._get_default_store()
    solo = None
    for r in range(plane.world_size):  # collective: one single-rank group per rank
        g = dist.new_group([r], timeout=timedelta(seconds=rc.timeout_s), backend="gloo")
        if r == rank:
            solo = g
    assert solo is not None
    solo_groups = StageGroups(solo, solo, solo, solo, solo)
    globs = hf.initial_states(solo_groups)  # drawn, or each rank's shard of a checkpoint
    ft.watch(setup, rc, cfg, ctl, recorder)
    settle()  # the imported modules out of the collector's reach, before any unit is built
    ft.preempt.on_abandon(lambda reason: ft.dump(rank, reason))
    rank_zero = None if ctl is None or recorder is None else RankZero(
        ctl, recorder, rc, cluster=ft.cluster_watch())
    globs, counters, start = ft.start_state(globs)
    mine = setup.cluster.gpu_of(rank)  # this rank's hardware (its node group's, if mixed)
    if mine.vendor == "cpu" and not dev.on_gpu and retain_freed_memory():
        reserve(mine.memory_bytes)  # a virtual GPU: its memory mapped up front
    if ft.resume is not None and ft.resume.order is not None:  # grown: the DAG extends
        from nereus.runtime.mpi.growth import extend

        units, grew = extend(comm, ft.resume, rank, rc.timeout_s, rc.lr, store, dev)
        ft.resumed(plan, globs, grew)
    else:
        units = PlanUnits(setup, plan, rank, rc.timeout_s, rc.lr, globs, counters, store, "p0",
                          device=dev, zero=_zero_options(rc) if rc.zero_stages else None,
                          zero_names=rc.zero_stages)
        ft.resumed(plan, globs)
    hf.report_load(comm, rank, recorder)
    account = account_for_run(rank, setup, rc.capacity_drop, dev.device, rc.inject_oom)
    inp = StepInputs(setup, rc, inputs)
    version = 0
    pending: Rollout | None = None  # async: the next step's batch, generated ahead
    if start == 0 and ft.resume is None:  # the initial state too: a death in step 0 that takes
        ft.boundary(units, 0, version)  # every replica of a model-stage loses no state
        ft.checkpoint(plane, 0)
    step = start
    while step < rc.steps:
        ft.boundary(units, step, version)
        go = plane.broadcast(Message("step", plane.next_seq(), {
            "step": step, "plan": version, "stop": ft.preempt.requested,
            "leave": rank_zero.leaving(units.plan) if rank_zero and ft.enabled else []})
            if plane.is_root else None, "step")
        if go.payload.get("leave"):  # a drained node's ranks exit; the others shrink to them
            from nereus.runtime.failures.drain import leave_or_raise

            leave_or_raise(rank, go.payload["leave"], ft, units, dev)
        if go.payload.get("stop"):  # preempted: every rank stops at this boundary
            hf.export(units, comm, plane.is_root, step, recorder, ft.segment)
            code = _preempted(plane, ft, recorder, step)
            ft.disarm()
            units.destroy()
            dev.destroy()
            dist.destroy_process_group()
            return code
        maybe_fail(step)
        ft.arm(rank, step, "step")
        ft.preempt.step_started()
        t0 = time.perf_counter()
        if setup.job.mode == "async":  # batch step+1 generated beside this step's training
            res, pending = run_async_step(inp, units, step, comm, account, pending)
        else:
            res = run_step(inp, units, step, comm, account)
        step_s = time.perf_counter() - t0
        ft.preempt.step_ended(step_s)
        ft.due(step, "step")  # an injected death of this step lands inside it
        gathered = plane.gather({"rank": rank, "step_s": step_s, **res,
                                 "sync_transports": units.sync_transports})
        order_d: dict[str, Any] | None = None
        redo, fail = False, ""
        if plane.is_root:  # observe → calibrate → decide → log (rank0/loop.py)
            assert rank_zero is not None and gathered is not None
            redo, fail = rank_zero.redo_verdict(step, gathered)
            if setup.cluster.heterogeneous and recorder is not None:  # weights across types
                recorder.event(step, "weight-sync", {
                    "transports": summed(g["sync_transports"] for g in gathered),
                    "bytes": int(gathered[0].get("sync_bytes", 0))})
            order = None if fail else rank_zero.boundary(step, gathered, units.plan)
            order_d = None if order is None else order.to_wire()
        msg = plane.broadcast(Message("plan", plane.next_seq(), {
            "order": order_d, "redo": redo, "fail": fail}) if plane.is_root else None, "plan")
        if msg.payload.get("fail"):  # the step ran out of device memory twice: end, one line
            from nereus.runtime.worker.memory import DeviceOutOfMemory

            raise DeviceOutOfMemory(str(msg.payload["fail"]))
        redo = bool(msg.payload.get("redo"))  # a rank ran out of device memory: step again
        next_step = step if redo else step + 1
        ft.replicate(plane)  # any survivor can take over the controller from here
        ft.boundary(units, next_step, version)
        if not redo:
            ft.checkpoint(plane, step + 1)
            if rc.save_hf.due(step + 1, rc.steps):
                hf.export(units, comm, plane.is_root, step + 1, recorder, ft.segment)
        ft.arm(rank, step, "transition")
        if msg.payload["order"] is None or (step == rc.steps - 1 and not redo):
            step = next_step
            continue
        order = PlanChangeOrder.from_wire(msg.payload["order"])  # → execute, on every rank
        t1 = time.perf_counter()
        version += 1
        if max(order.pool) >= plane.world_size:  # a late node was granted: its ranks join
            from nereus.runtime.mpi.growth import Grown, grow

            raise Grown(*grow(comm, units, ft, order, step, worker_argv=sys.argv[1:]))
        units, change = change_plan(comm, units, order, store, version, lr=rc.lr)
        ft.due(step, "transition")
        measured = max_over_ranks(comm, time.perf_counter() - t1)
        # the transfer groups of every rank by transport, and each rank's seconds per phase
        told = frames.allgather(comm, {"t": change.transports, "p": change.phases_s},
                                "transports")
        transports = summed([t["t"] for t in told])
        phases = [t["p"] for t in told]
        if plane.is_root:
            assert recorder is not None and rank_zero is not None
            rank_zero.transition_done(order, measured, change.executor, change.bytes_moved)
            recorder.transition(step, {"kind": order.kind, "predicted_s": order.predicted_s},
                                order.target, measured, change.bytes_moved, change.lost,
                                executor=change.executor, primitives=change.primitives,
                                dag_detail={"reason": change.reason, "waves": change.waves,
                                            "compilations": order.compilations,
                                            "transports": transports,
                                            **({"phases_max_s": {k: max(p.get(k, 0.0)
                                                                        for p in phases)
                                                                 for k in phases[0]}}
                                               if phases and phases[0] else {})})
        step = next_step
    if rc.save_state:
        final, _, _ = gather_state(units, comm, setup.cluster.all_gpus())
        if plane.is_root:  # the file named (no ".npz" added), new, whole or not at all
            import io

            import numpy as np

            from nereus.log.outputs import NewFile

            flat = {f"{ms}/{f}/{t}": a for ms, g in final.items() for f, d in g.items()
                    for t, a in d.items() if f == "param"}
            buf, out = io.BytesIO(), NewFile(rc.save_state, "runtime.save_state")
            np.savez(buf, **flat)  # type: ignore[arg-type]
            out.write(buf.getvalue())
            out.publish()
    ft.disarm()
    ft.preempt.done()  # the run ended: a signal from now on changes nothing
    plane.agree(True)  # a rank lost up to here is a failure like any other (log still open)
    units.destroy()
    dev.destroy()
    if plane.is_root:
        assert recorder is not None
        summary = recorder.finish()
        if args.summary_json:
            with open(args.summary_json, "w", encoding="utf-8") as fh:
                json.dump(summary, fh)
    dist.destroy_process_group()
    return 0


def _continues(args: argparse.Namespace, ft: Any) -> bool:
    """Whether rank 0 continues an existing run log (a resumed run) instead of creating it."""
    return bool(args.resume) and ft.restart is not None and os.path.exists(args.log)


def _preempted(plane: Any, ft: Any, recorder: Any, step: int) -> int:
    """Every rank, at the boundary before ``step`` after a preemption signal: the checkpoint
    of this boundary (rank 0 writes it), a ``preempted`` event, the log closed; the exit
    status for a requeue (:data:`nereus.runtime.failures.preemption.EXIT_PREEMPTED`)."""
    from nereus.runtime.failures.preemption import EXIT_PREEMPTED

    t0 = time.perf_counter()
    path = ft.checkpoint(plane, step, force=True)
    if plane.is_root and recorder is not None:
        notice = ft.preempt.notice
        recorder.log.log_event(max(step - 1, 0), "preempted", {
            "abandoned": False, "step": step, "checkpoint": path,
            "checkpoint_s": time.perf_counter() - t0,
            **({} if notice is None else notice.to_dict())})
        recorder.log.close()
        recorder.say(f"  preempted: checkpoint of the boundary before step {step + 1} in "
                     f"{path}; resume with --resume")
    ft.preempt.done()
    plane.agree(True)
    return EXIT_PREEMPTED


def _zero_options(rc: Any) -> Any:
    """``runtime.deepspeed`` as the DeepSpeed engine's options."""
    from nereus.engines.deepspeed_engine import DeepSpeedOptions

    return DeepSpeedOptions(rc.deepspeed.stage, rc.deepspeed.config)


if __name__ == "__main__":
    sys.exit(main())
