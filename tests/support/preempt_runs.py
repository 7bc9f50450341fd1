"""Preempting a running ``nereus run`` the way a scheduler does (for mpi/test_preemption.py and
the Slurm preemption tests): the job, a signal sent once a chosen step has been printed, and how
a log's steps and lifecycle events are read back."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.failure_runs import JOB
from support.paths import REPO

THREE = "cluster: {nodes: 3, gpus_per_node: 1, gpu: cpu, memory_per_gpu_gb: 0.5}\n"


def write_preempt_job(tmp: Path, name: str, steps: int, failures: str = "") -> Path:
    """Sync PPO on 3 CPU ranks with a fixed plan (adapt: false: the same plan before and after
    a resume, so the final state is bit-exact), saving its final parameters to ``<name>.npz``."""
    cfg = tmp / f"{name}.yaml"
    extra = f", failures: {{{failures}}}" if failures else ""
    cfg.write_text(JOB + THREE + f"runtime: {{steps: {steps}, timeout_s: 30, adapt: false, "
                   f"save_state: {tmp / f'{name}.npz'}{extra}}}\n")
    return cfg


def run_and_signal(args: list[str], sig: signal.Signals | None, after_step: int,
                   timeout_s: float = 600.0) -> tuple[int, str]:
    """``nereus run ARGS`` as a child; ``sig`` is sent to it once it printed step
    ``after_step`` (1-based, its console numbering). Returns (exit status, its output)."""
    proc = subprocess.Popen([sys.executable, "-m", "nereus", "run", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    sent = sig is None
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            out.append(line)
            if not sent and line.startswith(f"step {after_step:>3}/"):
                proc.send_signal(sig)
                sent = True
        code = proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
    return code, "".join(out)


def log_steps_and_events(log: Path) -> tuple[list[int], list[tuple[str, dict[str, Any]]]]:
    """The steps a run log holds, in order, and its lifecycle events (preempted, restart,
    checkpoint) with their details."""
    from nereus.log.reader import read_run_log

    r = read_run_log(log)
    events = [(str(k), dict(d)) for k, d in zip(r.events["kind"], r.events["detail"], strict=True)
              if k in ("preempted", "restart")]
    return [int(s) for s in r.steps["step"]], events
