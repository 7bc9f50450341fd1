"""What ``nereus run`` checks before any rank starts, in this order (any failure: one line,
exit 2, nothing created or changed):

1. the flags (``--timeout-s``; ``--log`` and ``--resume`` given empty: an unset variable);
2. the config and its ``runtime:`` section (:func:`nereus.config.run.parse_runtime`);
3. what the ranks' engines need here: vLLM (``runtime.generation: vllm``), DeepSpeed and its
   acceptance of ``runtime.deepspeed.config`` (``train_engine: deepspeed``), and the device
   ``runtime.device`` asks for, on this node (the other nodes' hardware is checked when their
   ranks bind; docs/config.md says which rule is checked where);
4. a plan that fits;
5. the state a resumed run starts from (``--resume``, a requeued Slurm job,
   ``runtime.failures.resume``): the newest usable checkpoint or dump, checked whole against
   the job (:mod:`nereus.runtime.failures.resume_check`); its step below the run's steps; the
   run log it continues readable, of this schema and this job;
6. Hugging Face checkpoints (``models.<role>.checkpoint``): the actor's tokenizer loads and every
   model embeds its ids (:func:`nereus.runtime.worker.hf_run.preflight`);
7. every output path: the ``runtime.save_hf`` folder (absent or empty unless the run resumes),
   the new log (never over anything), the checkpoint folder (a folder, or creatable),
   ``runtime.save_state`` (a new file), and the log's free space.

Warnings (unusable checkpoint files passed over) are printed only once everything passed.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time
from typing import Any

from nereus.errors import ConfigError

AUTO_RESUME = "\0auto"  # --resume without DIR: the log's own checkpoint directory


def default_log() -> str:
    """``nereus-run-<Slurm job id>.h5`` inside a Slurm job (the same name after a requeue, so
    the requeued job finds its log and checkpoint), else ``nereus-run-<time>.h5``."""
    job = os.environ.get("SLURM_JOB_ID")
    return f"nereus-run-{job}.h5" if job else f"nereus-run-{time.strftime('%Y%m%d-%H%M%S')}.h5"


def check_run(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """(run options, setup, run log) of ``nereus run ARGS``, every check above passed;
    ``args.resume`` is then the checkpoint folder a resumed run starts from, or None."""
    from nereus.cluster.probe import detected_gpu
    from nereus.config import fields
    from nereus.config.load import load_config
    from nereus.config.run import parse_runtime
    from nereus.engines.vllm_engine import require_vllm
    from nereus.errors import InfeasiblePlanError
    from nereus.log.writer import check_space
    from nereus.runtime.failures.resume_check import run_fingerprint
    from nereus.runtime.rank0.controller import RankZeroController

    fields.positive_float("--timeout-s", args.timeout_s, "MAX_TIMEOUT_S")
    if args.log == "":
        raise ConfigError("--log", "", "must be a file path (given empty: an unset variable?)")
    if args.resume == "":
        raise ConfigError("--resume", "", "must be a checkpoint folder (given empty: an unset "
                          "variable?); --resume alone takes the log's own")
    cfg = load_config(args.config, detect_gpu=detected_gpu)
    rc, setup = parse_runtime(cfg.section("runtime"), cfg.setup, ranks=args.ranks,
                              steps=args.steps, host_cores=getattr(args, "host_cores", 0))
    require_vllm(rc.generation)
    check_engines(rc)
    check_device(rc, setup)
    ctl = RankZeroController(setup, adapt=True)
    ctl.set_pool(range(rc.start_ranks))  # late nodes (runtime.late_nodes) join later
    plan, d = ctl.initial()
    if plan is None:
        reason = d.admission.reason if d.admission else "no plan"
        raise InfeasiblePlanError(f"no plan of {args.config} fits {rc.ranks} ranks of "
                                  f"{setup.cluster.gpu.memory_bytes / 1e9:g} GB: {reason}")
    notes: list[str] = []
    log = resolve_resume(args, rc, setup, run_fingerprint(cfg, rc), notes)
    from nereus.runtime.worker.hf_run import preflight

    # the actor's tokenizer against every model; the export folder (after the resume is
    # resolved: a resumed or requeued run continues into its own)
    preflight(cfg, rc, setup, fresh=not args.resume)
    check_outputs(args, rc, log)
    check_space(log)
    for line in notes:
        print(line, file=sys.stderr, flush=True)
    return rc, setup, log


def check_engines(rc: Any) -> None:
    """``train_engine: deepspeed``: the package imports here and DeepSpeed accepts the config
    (its keys Nereus owns were refused when the config was read)."""
    if rc.train_engine != "deepspeed":
        return
    from nereus.engines.deepspeed_engine import DeepSpeedOptions, check_config, require_deepspeed

    require_deepspeed(rc.train_engine)
    check_config(DeepSpeedOptions(rc.deepspeed.stage, rc.deepspeed.config))


def check_device(rc: Any, setup: Any) -> None:
    """``runtime.device`` on this node, as its rank 0 will bind it (``cuda`` needs a GPU; the
    hardware's vendor must be the cluster's; DeepSpeed runs on CPU ranks only)."""
    vendor = setup.cluster.gpu.vendor
    if rc.device == "cpu" or (rc.device == "auto" and vendor == "cpu"):
        return  # the CPU, whatever the node has: nothing to look at
    from nereus.cluster.devices import select_device
    from nereus.cluster.env import from_os_environ
    from nereus.cluster.probe import device_facts

    choice = select_device(rc.device, device_facts(from_os_environ()), vendor)
    if choice.on_gpu and rc.train_engine == "deepspeed":
        raise ConfigError("runtime.train_engine", "deepspeed",
                          "runs on CPU ranks only (set runtime.device: cpu)")


def _folder(field: str, path: str) -> str:
    """``path`` must be an existing folder (one to read checkpoints from)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        what = "a dangling symlink" if os.path.islink(path) else "no such folder"
        raise ConfigError(field, path, f"{what}; must be a checkpoint folder") from None
    except OSError as exc:
        raise ConfigError(field, path, f"cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(info.st_mode):
        from nereus.config.files import kind_of

        what = "a file" if stat.S_ISREG(info.st_mode) else kind_of(info.st_mode)
        raise ConfigError(field, path, f"is {what}, not a checkpoint folder")
    return os.path.abspath(path)


def _output_folder(field: str, path: str) -> None:
    """``path`` is a folder the ranks may write into, or can be made one (its nearest existing
    parent a writable folder); nothing is created here."""
    probe = os.path.abspath(path)
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    try:
        info = os.stat(probe)
    except OSError as exc:
        raise ConfigError(field, path, f"cannot be used ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(info.st_mode):
        from nereus.config.files import kind_of

        what = "a file" if stat.S_ISREG(info.st_mode) else kind_of(info.st_mode)
        where = "" if probe == os.path.abspath(path) else f" {probe}"
        raise ConfigError(field, path, f"must be a folder for checkpoints, but{where} is {what}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(field, path, f"{probe} is not writable (permissions or a read-only "
                          "file system)")


def check_outputs(args: argparse.Namespace, rc: Any, log: str) -> None:
    """The log (new, or the one a resume continues: checked already), the checkpoint folder
    and ``runtime.save_state``."""
    from nereus.log.outputs import check_new_path
    from nereus.runtime.failures.relaunch import checkpoint_dir

    if not args.resume:  # rank 0 creates it (in place: readable while it grows); never over
        try:
            check_new_path(log, "--log")
        except ConfigError as e:
            if not os.path.lexists(log):
                raise
            raise ConfigError(e.field, e.value, f"{e.rule} (or --resume continues a preempted "
                              "run in its own log)") from None
    folder = checkpoint_dir(os.path.abspath(log), rc.failures.checkpoint_dir)
    field = ("runtime.failures.checkpoint_dir" if rc.failures.checkpoint_dir
             else "--log (its checkpoint folder <log>.ckpt)")
    _output_folder(field, folder)
    if rc.save_state:
        check_new_path(rc.save_state, "runtime.save_state")


def resolve_resume(args: argparse.Namespace, rc: Any, setup: Any, fingerprint: Any,
                   notes: list[str]) -> str:
    """The run log, and ``args.resume`` set to the checkpoint folder a resumed run starts from
    (or None: a fresh run). ``--resume DIR`` without ``--log`` continues the log the checkpoint
    names. Under Slurm a requeued job (``SLURM_RESTART_COUNT`` > 0) resumes by itself when its
    checkpoint folder holds anything. The state is checked whole (``notes``: the warnings for
    unusable files passed over, printed by the caller once every check passed)."""
    from nereus.runtime.failures.relaunch import checkpoint_dir
    from nereus.runtime.failures.resume_check import expected_for, select

    explicit = args.resume not in (None, AUTO_RESUME)
    if explicit:
        args.resume = _folder("--resume", args.resume)
    log = args.log
    if log is None and explicit:
        sel = select(args.resume, expected_for(setup, fingerprint))
        if sel.choice is None:
            raise ConfigError("--resume", args.resume, sel.refusal("--resume", args.resume))
        log = sel.choice.log
        if not log:
            raise ConfigError("--log", None, "is needed with --resume DIR when DIR names no log")
    log = log or default_log()
    directory = args.resume if explicit else checkpoint_dir(os.path.abspath(log),
                                                            rc.failures.checkpoint_dir)
    expect = expected_for(setup, fingerprint, log)
    if args.resume is None:
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        if getattr(args, "relaunch", False):  # a relaunch's segment: failures.resume decides
            restarts = 0
        if restarts > 0 and os.path.isdir(directory) and os.listdir(directory):
            sel = select(directory, expect)
            field = "--resume"
            if sel.choice is None and sel.skipped:
                raise ConfigError(field, directory, f"(automatic: Slurm restart {restarts}) "
                                  + sel.refusal("--resume", directory))
            if sel.choice is not None:
                _chosen(sel, rc, args, field, directory, notes)
                if os.path.lexists(log):  # else the first attempt died before its log: a new one
                    check_continued_log(log, fingerprint)
                notes.append(f"nereus: Slurm restart {restarts}: resuming from {directory} "
                             f"(step {sel.choice.step})")
                args.resume = os.path.abspath(directory)
        if args.resume is None and rc.failures.resume:
            _configured_resume(rc, setup, fingerprint, args, notes)
        return log
    sel = select(directory, expect)
    if sel.choice is None:
        raise ConfigError("--resume", directory, sel.refusal("--resume", directory))
    _chosen(sel, rc, args, "--resume", directory, notes)
    notes.append(f"nereus: resuming from {sel.choice.source} (step {sel.choice.step})")
    if not os.path.isfile(log):
        raise ConfigError("--log", log, "must be the preempted run's log (a regular file) "
                          "to continue with --resume")
    check_continued_log(log, fingerprint)
    args.resume = os.path.abspath(directory)
    return log


def _chosen(sel: Any, rc: Any, args: argparse.Namespace, field: str, directory: str,
            notes: list[str]) -> None:
    """The chosen state must leave steps to run; the files passed over become warnings."""
    ch = sel.choice
    if ch.step >= rc.steps:
        steps = "--steps" if args.steps is not None else "runtime.steps"
        raise ConfigError(field, directory, f"its newest usable state ({ch.source}) starts at "
                          f"step {ch.step + 1}, but the run has {steps}={rc.steps}: nothing is "
                          f"left to run (give more steps)")
    notes.extend(sel.warnings())


def _configured_resume(rc: Any, setup: Any, fingerprint: Any, args: argparse.Namespace,
                       notes: list[str]) -> None:
    """``runtime.failures.resume``: a new log started from another run's state (the restart
    baseline, and a relaunch on the surviving nodes)."""
    from nereus.runtime.failures.resume_check import expected_for, select

    field = "runtime.failures.resume"
    directory = _folder(field, rc.failures.resume)
    sel = select(directory, expected_for(setup, fingerprint))
    if sel.choice is None:
        raise ConfigError(field, rc.failures.resume, sel.refusal(field, directory))
    _chosen(sel, rc, args, field, directory, notes)
    notes.append(f"nereus: {field}: starting from {sel.choice.source} (step {sel.choice.step})")


def check_continued_log(log: str, fingerprint: Any) -> None:
    """The run log a resume appends to, read only: a run log of the schema this nereus writes,
    written by this job (the fingerprint of its newest segment)."""
    from nereus.config.fingerprint import Fingerprint
    from nereus.log import schema as S
    from nereus.log.reader import LogFormatError, read_run_log

    try:
        run_log = read_run_log(log)
    except LogFormatError as exc:
        raise ConfigError("--log", log, f"cannot be continued: {exc}") from None
    if run_log.schema_version != S.SCHEMA_VERSION:
        raise ConfigError("--log", log, f"has schema {run_log.schema_version}; this nereus "
                          f"continues schema {S.SCHEMA_VERSION} only (start a new log)")
    recorded: Any = run_log.run_meta.get("fingerprint")
    for kind, detail in zip(run_log.events["kind"], run_log.events["detail"], strict=True):
        if kind == "run-start" and isinstance(detail, dict) and "fingerprint" in detail:
            recorded = detail["fingerprint"]
    if recorded is None:
        raise ConfigError("--log", log, "records no job fingerprint (written by an older "
                          "nereus, or not by nereus run): start a new log")
    fp = Fingerprint.from_dict(recorded)
    if fp is None:
        raise ConfigError("--log", log, "has a malformed job fingerprint (edited or damaged)")
    if fp != fingerprint:
        raise ConfigError("--log", log, f"was written by another job "
                          f"({fingerprint.differences(fp)}): continue it with its own config")
