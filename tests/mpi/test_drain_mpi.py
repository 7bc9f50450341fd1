"""A node leaving with notice (``drain_node``): the transition DAG moves its state off, then its
ranks exit for real while the job goes on (real MPI ranks under ULFM, real processes).

On one host the node's ranks are processes: the test finds every rank's PID (the worker's command
line names the run log; Open MPI gives each its ``OMPI_COMM_WORLD_RANK``), and when ``nereus run``
says the drained ranks exited it checks that node 2's rank is gone and the others still run.
Runtime on 2 shared cores: about 30 s.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.failure_runs import JOB
from support.paths import REPO

pytestmark = pytest.mark.skipif(shutil.which("mpiexec") is None,
                                reason="needs mpiexec (the mpi extra)")
THREE = "cluster: {nodes: 3, gpus_per_node: 1, gpu: cpu, memory_per_gpu_gb: 0.5}\n"
STEPS = 10


def rank_pids(log: Path) -> dict[int, int]:
    """MPI rank -> PID of the job's worker processes (found in /proc by their command line)."""
    out: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            if b"nereus.runtime.worker.main" not in cmd or str(log).encode() not in cmd:
                continue
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # ended meanwhile
            continue
        for kv in env:
            if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                out[int(kv.split(b"=", 1)[1])] = int(proc.name)
    return out


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_drained_node_ranks_exit_after_the_dag_moved_their_state(tmp_path: Path) -> None:
    from nereus.log.reader import read_run_log

    cfg = tmp_path / "drain.yaml"
    log = tmp_path / "drain.h5"
    cfg.write_text(JOB + THREE + f"runtime: {{steps: {STEPS}, timeout_s: 30, "
                   "events: [{at_step: 1, drain_node: 2}]}\n")
    proc = subprocess.Popen([sys.executable, "-m", "nereus", "run", str(cfg), "--log", str(log)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    pids: dict[int, int] = {}
    seen: dict[int, bool] = {}
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            out.append(line)
            if line.startswith("step   1/"):
                pids = rank_pids(log)
            if "of drained nodes exited" in line:
                deadline = time.time() + 10
                while running(pids.get(2, -1)) and time.time() < deadline:
                    time.sleep(0.1)
                seen = {r: running(p) for r, p in pids.items()}
        code = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(out)
    assert code == 0, text[-3000:]
    assert sorted(pids) == [0, 1, 2], (pids, text[-2000:])
    assert seen == {0: True, 1: True, 2: False}, (seen, text[-2000:])  # node 2 left, job on
    r = read_run_log(log)
    assert [int(s) for s in r.steps["step"]] == list(range(STEPS))
    # the state was moved off node 2 by the transition DAG while its rank still ran
    first = r.tables["transitions"]["dag"][0]
    assert first["executor"] == "dag", first
    plan = r.tables["transitions"]["plan"][0]
    assert 2 not in {g for sp in plan["stages"] for rep in sp["replicas"] for g in rep}, plan
    ev = [d for k, d in zip(r.events["kind"], r.events["detail"], strict=True)
          if k == "rank-failure"]
    assert len(ev) == 1 and ev[0]["drained"] and ev[0]["lost_ranks"] == [2], ev
    assert ev[0]["restored_from"] == "replicas" and ev[0]["steps_lost"] == 0, ev[0]
