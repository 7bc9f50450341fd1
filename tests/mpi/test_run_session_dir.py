"""``nereus run`` starts even where killed Open MPI runtimes left their session directories.

A killed ``mpiexec`` (PRRTE) leaves ``ompi.<its pid>`` with the PMIx server's rendezvous files in
its temporary directory. A later ``mpiexec`` that draws the same pid (pids wrap at 32768 on many
machines, and a test suite or a long job on one host spends them fast) cannot bind its
rendezvous and dies at start-up: exit 213, "The PMIx server's listener thread failed to start"
(seen in a CI run). Here a real session directory, left by a real SIGKILLed mpiexec, is copied
to the next few thousand pids of the temporary directory ``nereus run`` is given; plain mpiexec
there fails as described (checked first), every pid the run draws is covered (checked after:
the test cannot pass for want of a collision), and ``nereus run`` — which puts each launch's
session directory in a new folder of its own — runs (with ``launch_retries: 0``: no second
launch may hide a collision). Runtime: ~20-40 s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("mpiexec") is None,
                                reason="needs mpiexec (the mpi extra)")
ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = ("mpiexec", "--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ob1",
           "--mca", "btl", "tcp,self", "--with-ft", "ulfm")
JOB = """job: {algorithm: ppo, mode: sync, global_batch: 8, minibatches: 2, prompt_len: 8,
      gen_len: 8, reward_model: false}
models: {actor: tiny-gpt, critic: tiny-gpt, reference: tiny-gpt}
cluster: {nodes: 2, gpus_per_node: 1, gpu: cpu, memory_per_gpu_gb: 0.5}
runtime: {steps: 1, adapt: false, failures: {launch_retries: 0}}
"""
AHEAD = 4000  # pids covered past the last one handed out


def _killed_session(base: Path) -> Path:
    """The session directory a SIGKILLed mpiexec leaves in ``base``."""
    env = dict(os.environ, TMPDIR=str(base))
    env.pop("PRTE_MCA_prte_tmpdir_base", None)
    proc = subprocess.Popen([*MPIEXEC, "-n", "1", "sleep", "60"], env=env,
                            start_new_session=True)
    session = base / f"ompi.{proc.pid}"
    deadline = time.monotonic() + 60
    while not any(session.glob("pmix.*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert any(session.glob("pmix.*")), "mpiexec wrote no rendezvous file"
    return session


def _last_pid() -> int:
    return int(Path("/proc/sys/kernel/ns_last_pid").read_text())


def _pids_since(last: int) -> int:
    """Pids handed out since ``last`` (wrapping at pid_max back to 300)."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    now = _last_pid()
    return now - last if now >= last else pid_max - last + now - 300


def _litter(base: Path, session: Path) -> int:
    """Copies of the stale session for the next AHEAD pids (one process: copying spends none);
    returns the last pid handed out before them."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    last = _last_pid()
    for k in range(1, AHEAD + 1):
        pid = last + k if last + k < pid_max else 300 + (last + k) % pid_max
        target = base / f"ompi.{pid}"
        if not target.exists():
            shutil.copytree(session, target, symlinks=True)
    return last


def test_nereus_run_starts_beside_stale_open_mpi_sessions(tmp_path: Path) -> None:
    base = tmp_path / "tmp"
    base.mkdir()
    session = _killed_session(base)
    env = dict(os.environ, TMPDIR=str(base))
    env.pop("PRTE_MCA_prte_tmpdir_base", None)

    _litter(base, session)
    plain = subprocess.run([*MPIEXEC, "-n", "1", "true"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert plain.returncode == 213 and "listener thread failed to start" in plain.stderr, (
        plain.returncode, plain.stderr[-1000:])

    cfg = tmp_path / "job.yaml"
    cfg.write_text(JOB)
    last = _litter(base, session)
    res = subprocess.run([sys.executable, "-m", "nereus", "run", str(cfg), "--log",
                          str(tmp_path / "run.h5"), "--json"], env=env, capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    spent = _pids_since(last)
    assert res.returncode == 0, res.stderr[-3000:]
    # every pid the run drew (its mpiexec's among them) had a stale session in the way
    assert spent < AHEAD, f"the run drew {spent} pids, past the {AHEAD} covered"
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["steps"] == 1 and out["launch_retries"] == 0
    assert not list(base.glob("nereus-run-*"))  # the launch's folder went with the run
