"""Runs inside a 3-node ``--no-kill`` Slurm job (test_slurm_cluster.py): a miniature controller.

It starts one srun step on all nodes, turns srun's stderr and the SlurmWatcher's polls into
events (one JSON line each in ``events.jsonl``), and once a node was lost and the step ended it
relaunches the step on the surviving pool with :func:`on_survivors` (the step sized for the
nodes left). Usage: ``driver.py WORKDIR``.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from launchers.commands import LaunchSpec, srun_argv
from nereus.cluster.env import from_os_environ
from nereus.cluster.slurm_watch import (
    NodesGained,
    NodesLost,
    PoolChanged,
    SlurmWatcher,
    parse_srun_stderr_line,
)
from nereus.errors import ConfigError

TASK = ("import os, pathlib, time; d = pathlib.Path({work!r}); "
        "(d / ('started.' + os.environ['SLURM_PROCID'])).touch(); "
        "t = time.monotonic()\n"
        "while not (d / 'release').exists() and time.monotonic() - t < 40: time.sleep(0.1)\n"
        "print('step1 done', os.environ['SLURM_PROCID'], os.environ['SLURMD_NODENAME'], flush=True)")


def on_survivors(spec: LaunchSpec, nodes: tuple[str, ...]) -> LaunchSpec:
    """The same launch restricted to ``nodes`` (a relaunch inside a shrunken allocation).

    Keeps ranks per node when known; otherwise keeps one rank per node.
    """
    if not nodes:
        raise ConfigError("launch.nodelist", nodes, "a relaunch needs at least one node")
    per_node = spec.ntasks_per_node
    if per_node is None and spec.ntasks is not None:
        base = spec.nodes or len(spec.nodelist) or None
        per_node = spec.ntasks // base if base else None
    ntasks = per_node * len(nodes) if per_node else len(nodes)
    return dataclasses.replace(spec, nodelist=tuple(nodes), nodes=len(nodes), ntasks=ntasks,
                   ntasks_per_node=per_node)


def main(work: Path) -> int:
    job = from_os_environ()
    assert job.slurm_job_id is not None, "must run inside a Slurm job"
    events_path = work / "events.jsonl"
    lock = threading.Lock()
    seen: list[object] = []

    def record(source: str, event: object) -> None:
        with lock:
            seen.append(event)
            with events_path.open("a") as out:
                row = {"source": source, "type": type(event).__name__, **dataclasses.asdict(event)}
                out.write(json.dumps(row) + "\n")

    spec = LaunchSpec(argv=("python3", "-c", TASK.format(work=str(work))), ntasks=3, nodes=3,
                      ntasks_per_node=1, cpu_bind=None, no_kill=True)
    step = subprocess.Popen(srun_argv(spec), stderr=subprocess.PIPE, text=True)

    def read_stderr() -> None:
        assert step.stderr is not None
        for line in step.stderr:
            sys.stderr.write(line)
            event = parse_srun_stderr_line(line)
            if event is not None:
                record("srun", event)

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    watcher = SlurmWatcher(job.slurm_job_id, watched=job.job_nodes)
    pool: tuple[str, ...] = job.job_nodes
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for event in watcher.poll():
            record("watcher", event)
            if isinstance(event, PoolChanged):
                pool = event.nodes
        with lock:
            lost = any(isinstance(e, NodesLost) for e in seen)
            gained = any(isinstance(e, NodesGained) for e in seen)
        if step.poll() is not None and lost and gained:
            break
        time.sleep(0.3)
    step.wait(timeout=30)
    reader.join(timeout=5)
    relaunch = on_survivors(spec, pool)
    relaunch = dataclasses.replace(relaunch, argv=(
        "python3", "-c", "import os; print('relaunch', os.environ['SLURM_PROCID'], "
        "os.environ['SLURMD_NODENAME'], flush=True)"))
    rc = subprocess.run(srun_argv(relaunch), timeout=60, check=False).returncode
    (work / "relaunch.rc").write_text(f"{rc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
