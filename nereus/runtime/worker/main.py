"""The rank program of ``nereus run``: ``python -m nereus.runtime.worker.main --config C --log L``.

Every rank parses the same config (deterministic), joins the MPI control plane and the
torch.distributed rendezvous whose address rank 0 broadcasts. Rank 0 runs the controller and
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
    return p.parse_args(argv)


def _agree(plane: Any, fn: Any) -> Any:
    """Run ``fn`` on every rank; raise the first failure on every rank."""
    from nereus.errors import NereusError

    out, err, kind = None, "", ""
    try:
        out = fn()
    except NereusError as e:
        err, kind = str(e), type(e).__name__
    except Exception as e:  # reported on every rank by agree
        err, kind = f"{type(e).__name__}: {e}", "Exception"
    plane.agree(not err, f"{kind}|{err}")
    return out


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
    import torch

    torch.set_num_threads(1)
    from mpi4py import MPI

    from nereus.errors import CommunicationError
    from nereus.runtime.failures.recovery import FailureHandler
    from nereus.runtime.failures.ulfm import RankFailure, secondary
    from nereus.runtime.mpi.frames import FrameError
    from nereus.runtime.mpi.growth import Grown, Links, join_parent, joined
    from nereus.runtime.mpi.plane import ControlPlane

    links = Links()
    comm = join_parent(links) or MPI.COMM_WORLD  # spawned for a late node: the merged job
    plane = ControlPlane(comm)
    ft = FailureHandler(comm, args.log)
    devices: list[Any] = []  # the RankDevice of each attempt: its communicators to abort
    if links.pairs:  # the job's setup as the config gives it (see growth.joined)
        joined(comm, ft, _configure(args, None)[2])
    while True:
        try:
            code = _run(args, comm, plane, ft, devices)
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
                return _agreed_error(plane, e)
            try:
                survived = ft.survive(comm, plane.global_rank, e) if secondary(e) else None
            except RankFailure as lost:  # survivors, but state or plan lost: one line, exit
                if ft.leader or not ft.leader_known:  # before the survivors had a leader: each
                    _report(args, plane.global_rank, f"RankFailure: {lost}")
                ft.close_log(str(lost))
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


def _configure(args: argparse.Namespace, detected: Any) -> tuple[Any, Any, Any]:
    """(config, run options, setup) of the job, as every rank reads them (``detected``: the GPU
    ``cluster.gpu: auto`` stands for, as rank 0 found it, or None)."""
    from nereus.config.load import load_config
    from nereus.config.run import parse_runtime

    cfg = load_config(args.config, detect_gpu=None if detected is None else lambda: detected)
    rc, setup = parse_runtime(cfg.section("runtime"), cfg.setup, ranks=args.ranks,
                              steps=args.steps, host_cores=args.host_cores)
    return cfg, rc, setup


def _run(args: argparse.Namespace, comm: Any, plane: Any, ft: Any,
         devices: list[Any] | None = None) -> int:
    from dataclasses import asdict

    import torch.distributed as dist

    from nereus.engines.vllm_engine import require_vllm
    from nereus.errors import ConfigError, InfeasiblePlanError
    from nereus.rl.sample_order import SampleOrder
    from nereus.rl.task import PatternTask
    from nereus.runtime.execution.gather_reload import gather_state
    from nereus.runtime.execution.plan_change import change_plan
    from nereus.runtime.mpi import frames
    from nereus.runtime.mpi.plane import Message
    from nereus.runtime.mpi.rendezvous import rendezvous
    from nereus.runtime.rank0.controller import RankZeroController
    from nereus.runtime.rank0.loop import RankZero
    from nereus.runtime.rank0.recorder import RunRecorder
    from nereus.runtime.worker.host_memory import reserve, retain_freed_memory
    from nereus.runtime.worker.memory import account_for_run
    from nereus.runtime.worker.step import Rollout, StepInputs, run_async_step, run_step
    from nereus.runtime.worker.units import PlanUnits, initial_global
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

    found = _agree(plane, detect)
    detected = frames.bcast(comm, None if found is None else asdict(found), 0, "gpu")
    detected = None if detected is None else GpuSpec(**detected)

    def setup_all() -> Any:
        cfg, rc, setup = _configure(args, detected)
        require_vllm(rc.generation)
        if rc.train_engine == "deepspeed":  # imports, and DeepSpeed accepts its config
            from nereus.engines.deepspeed_engine import check_config, require_deepspeed

            require_deepspeed(rc.train_engine)
            check_config(_zero_options(rc))
        if rc.start_ranks != plane.world_size and ft.resume is None:
            raise ConfigError("--ranks", plane.world_size, f"the MPI job has {plane.world_size} "
                              f"ranks, the config starts {rc.start_ranks}")
        return cfg, rc, setup

    cfg, rc, setup = _agree(plane, setup_all)
    if ft.resume is not None:  # survivors of dead ranks: a smaller cluster, renumbered
        setup, rc = ft.resume.setup, ft.resume.rc
    dev, rc = _bind_device(plane, comm, rc, setup)
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

    plan_d = _agree(plane, lambda: (ft.resume.plan.to_dict() if ft.resume else
                                    first_plan().to_dict()) if plane.is_root else None)
    plan = ExecutionPlan.from_dict(plane.broadcast(
        Message("plan", plane.next_seq(), {"plan": plan_d}) if plane.is_root else None, "plan"
    ).payload["plan"])
    if plane.is_root:
        recorder = _agree(plane, lambda: ft.resume.recorder if ft.resume else
                          RunRecorder(args.log, setup, rc, cfg, plan))
    else:
        _agree(plane, lambda: None)

    from nereus.cluster.transport import default_backend

    rendezvous(plane, generation=ft.generation, timeout_s=rc.timeout_s,
               backend=default_backend(dev.placements))
    if recorder is not None:
        recorder.event(0, "devices", _devices_event(dev, rc))
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
    seeds = {"actor": rc.seed, "reference": rc.seed, "critic": rc.seed + 1, "reward": rc.seed + 2}
    globs = {}
    for ms in setup.job.workflow.model_stages:
        spec = setup.job.model(ms.role)
        same_as_actor = ms.role == "reference" and spec == setup.job.model("actor")
        globs[ms.name] = initial_global(spec, seeds["actor" if same_as_actor else ms.role],
                                        solo_groups)
    ft.watch(setup, rc, cfg, ctl, recorder)
    rank_zero = None if ctl is None or recorder is None else RankZero(
        ctl, recorder, rc, cluster=ft.cluster_watch())
    globs, counters, start = ft.start_state(globs)
    if setup.cluster.gpu.vendor == "cpu" and not dev.on_gpu and retain_freed_memory():
        reserve(setup.cluster.gpu.memory_bytes)  # a virtual GPU: its memory mapped up front
    units = PlanUnits(setup, plan, rank, rc.timeout_s, rc.lr, globs, counters, store, "p0",
                      device=dev, zero=_zero_options(rc) if rc.zero_stages else None,
                      zero_names=rc.zero_stages)
    ft.resumed(plan, globs)
    account = account_for_run(rank, setup, rc.capacity_drop, dev.device, rc.inject_oom)
    inp = StepInputs(setup, rc, PatternTask(seed=rc.seed), SampleOrder(4096, rc.seed))
    version = 0
    pending: Rollout | None = None  # async: the next step's batch, generated ahead
    if start == 0 and ft.resume is None:  # the initial state too: a death in step 0 that takes
        ft.boundary(units, 0, version)  # every replica of a model-stage loses no state
        ft.checkpoint(plane, 0)
    step = start
    while step < rc.steps:
        ft.boundary(units, step, version)
        plane.broadcast(Message("step", plane.next_seq(), {"step": step, "plan": version})
                        if plane.is_root else None, "step")
        maybe_fail(step)
        ft.arm(rank, step, "step")
        t0 = time.perf_counter()
        if setup.job.mode == "async":  # batch step+1 generated beside this step's training
            res, pending = run_async_step(inp, units, step, comm, account, pending)
        else:
            res = run_step(inp, units, step, comm, account)
        step_s = time.perf_counter() - t0
        ft.due(step, "step")  # an injected death of this step lands inside it
        gathered = plane.gather({"rank": rank, "step_s": step_s, **res})
        order_d: dict[str, Any] | None = None
        redo, fail = False, ""
        if plane.is_root:  # observe → calibrate → decide → log (rank0/loop.py)
            assert rank_zero is not None and gathered is not None
            redo, fail = rank_zero.redo_verdict(step, gathered)
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
        ft.arm(rank, step, "transition")
        if msg.payload["order"] is None or (step == rc.steps - 1 and not redo):
            step = next_step
            continue
        order = PlanChangeOrder.from_wire(msg.payload["order"])  # → execute, on every rank
        t1 = time.perf_counter()
        version += 1
        if max(order.pool) >= plane.world_size:  # a late node was granted: its ranks join
            from nereus.runtime.mpi.growth import Grown, grow

            raise Grown(*grow(comm, units, ft, order.target, order.pool, step,
                              worker_argv=sys.argv[1:]))
        units, change = change_plan(comm, units, order, store, version, lr=rc.lr)
        ft.due(step, "transition")
        measured = _max_over_ranks(comm, time.perf_counter() - t1)
        transports: dict[str, int] = {}  # the transfer groups of every rank, by transport
        for got in frames.allgather(comm, change.transports, "transports"):
            for name, n in got.items():
                transports[name] = transports.get(name, 0) + int(n)
        if plane.is_root:
            assert recorder is not None and rank_zero is not None
            rank_zero.transition_done(order, measured, change.executor, change.bytes_moved)
            recorder.transition(step, {"kind": order.kind, "predicted_s": order.predicted_s},
                                order.target, measured, change.bytes_moved, change.lost,
                                executor=change.executor, primitives=change.primitives,
                                dag_detail={"reason": change.reason, "waves": change.waves,
                                            "compilations": order.compilations,
                                            "transports": transports})
        step = next_step
    if rc.save_state:
        final, _, _ = gather_state(units, comm, setup.cluster.all_gpus())
        if plane.is_root:
            import numpy as np

            flat = {f"{ms}/{f}/{t}": a for ms, g in final.items() for f, d in g.items()
                    for t, a in d.items() if f == "param"}
            np.savez(rc.save_state, **flat)  # type: ignore[arg-type]
    ft.disarm()
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


def _bind_device(plane: Any, comm: Any, rc: Any, setup: Any) -> tuple[Any, Any]:
    """Every rank: its device from the job environment and the node's inventory (agreed: a
    ``runtime.device: cuda`` without a GPU is the same one-line error on every rank), bound
    (``torch.cuda.set_device``) before any group or model exists; every rank's placement
    (MPI all-gather), so every rank computes the same transports; ``runtime.generation: auto``
    resolved as rank 0 sees it. Returns the rank's :class:`RankDevice` and the run config."""
    from dataclasses import replace

    from nereus.cluster.devices import select_device
    from nereus.cluster.env import from_os_environ
    from nereus.cluster.probe import device_facts
    from nereus.cluster.transport import RankPlacement
    from nereus.config.run import resolve_generation
    from nereus.runtime.execution.device import RankDevice
    from nereus.runtime.mpi import frames

    def choose() -> Any:
        job = from_os_environ()
        choice = select_device(rc.device, device_facts(job), setup.cluster.gpu.vendor)
        if choice.on_gpu and rc.train_engine == "deepspeed":
            from nereus.errors import ConfigError

            raise ConfigError("runtime.train_engine", "deepspeed",
                              "runs on CPU ranks only (set runtime.device: cpu)")
        if choice.on_gpu:
            import torch

            from nereus.engines.megatron_model import prepare_device

            torch.cuda.set_device(choice.index)
            prepare_device(rc.seed)
        return choice, job.node_name or _hostname()

    choice, node = _agree(plane, choose)
    placed = frames.allgather(comm, RankPlacement.of(plane.global_rank, node, choice).to_dict(),
                              "placement")
    placements = tuple(RankPlacement.from_dict(p) for p in placed)
    dev = RankDevice(choice, placements, plane.global_rank)

    def generation() -> Any:
        from nereus.engines.vllm_engine import vllm_unavailable_reason

        on_gpu = all(p.kind == "cuda" for p in placements)
        return resolve_generation(rc.generation, on_gpu, on_gpu and
                                  vllm_unavailable_reason() is None, setup)

    engine, why = frames.bcast(comm, list(generation()) if plane.is_root else None, 0,
                               "generation")
    dev.generation_reason = why
    return dev, replace(rc, generation=engine)


def _zero_options(rc: Any) -> Any:
    """``runtime.deepspeed`` as the DeepSpeed engine's options."""
    from nereus.engines.deepspeed_engine import DeepSpeedOptions

    return DeepSpeedOptions(rc.deepspeed.stage, rc.deepspeed.config)


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _devices_event(dev: Any, rc: Any) -> dict[str, Any]:
    """The log's record of where the ranks run (event ``devices``)."""
    from nereus.cluster.transport import default_backend

    return {"placements": [p.to_dict() for p in dev.placements],
            "rank0": dev.choice.to_dict(), "default_backend": default_backend(dev.placements),
            "dtype": str(dev.dtype).removeprefix("torch."), "pack": dev.packer.name,
            "generation": rc.generation, "generation_reason": dev.generation_reason}


def _max_over_ranks(comm: Any, value: float) -> float:
    """The largest ``value`` of all ranks (a buffer-based MPI_Allreduce: nothing pickled)."""
    import numpy as np
    from mpi4py import MPI

    out = np.zeros(1)
    comm.Allreduce(np.array([value], dtype=np.float64), out, op=MPI.MAX)
    return float(out[0])


if __name__ == "__main__":
    sys.exit(main())
