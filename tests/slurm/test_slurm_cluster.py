"""Tier 3 (real Slurm): sbatch scripts from the builder, submitit, node loss and return, requeue.

Runs against the local 3-node cluster of ``slurm_cluster.py`` (three slurmd on one host).
Slurm 22.05 facts these tests rely on (found here): ``scontrol update ... state=down`` removes the
node from a running ``--no-kill`` job at once; with ReturnToService=2 an admin-downed node whose
slurmd still answers returns to service within ~1 s, so the cluster uses ReturnToService=1; a
requeued job waits cred_expire+1 s, and ``AuthInfo`` must list ``cred_expire`` before ``socket``
for it to be read (otherwise the default 120 s applies).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.paths import SUPPORT
from support.slurm_cluster import LocalSlurm, job_info, wait_for, wait_job
from support.slurm_watch_driver import on_survivors

from launchers.commands import LaunchSpec, srun_argv
from launchers.sbatch import SbatchSpec, sbatch_script, submit
from launchers.submitit_entry import NereusEntry, submitit_parameters
from nereus.cluster.env import JobEnvironment
from nereus.cluster.slurm_watch import (
    SINFO_NODE_FORMAT,
    Event,
    NodesGained,
    NodesLost,
    PoolChanged,
    SlurmWatcher,
    make_subprocess_runner,
    parse_sinfo_nodes,
)

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[2]


def poll_until(watcher: SlurmWatcher, kind: type, timeout_s: float = 60.0) -> list[Event]:
    """Poll every 0.5 s until an event of ``kind`` arrives; all events seen until then."""
    events: list[Event] = []
    deadline = time.monotonic() + timeout_s
    while not any(isinstance(e, kind) for e in events):
        assert time.monotonic() < deadline, f"no {kind.__name__} within {timeout_s} s: {events}"
        time.sleep(0.5)
        events += watcher.poll()
    return events


def test_builder_script_runs_inventory_on_two_nodes(slurm_cluster: LocalSlurm,
                                                    tmp_path: Path) -> None:
    spec = SbatchSpec(
        job_name="inv", nodes=2, ntasks_per_node=1, cpus_per_task=1,
        output=str(tmp_path / "out-%j.txt"),
        error=str(tmp_path / "err-%j.txt"),
        launch=LaunchSpec(argv=(sys.executable, "-m", "nereus", "inventory", "--json",
                                "--virtual-devices", "$NDEV"), cpu_bind=None, label=True),
        positional=("NDEV",))
    job_id = submit(sbatch_script(spec), ("3",), cwd=str(REPO), env=slurm_cluster.env)
    info = wait_job(slurm_cluster, job_id, ("COMPLETED", "FAILED", "CANCELLED"))
    err = (tmp_path / f"err-{job_id}.txt").read_text()
    assert info.state == "COMPLETED", err
    by_rank: dict[str, list[str]] = {}
    for line in (tmp_path / f"out-{job_id}.txt").read_text().splitlines():
        rank, _, rest = line.partition(": ")  # srun --label
        by_rank.setdefault(rank.strip(), []).append(rest)
    assert sorted(by_rank) == ["0", "1"]
    reports = [json.loads("\n".join(lines))["nodes"][0] for lines in by_rank.values()]
    assert sorted(r["node"] for r in reports) == ["n1", "n2"]
    assert all(r["virtual"] and len(r["devices"]) == 3 for r in reports)
    assert all("no NVIDIA driver" in r["notes"][0] for r in reports)


def test_openmpi_mpiexec_under_slurm(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    code = ("from nereus.cluster.env import from_os_environ as f; e = f(); "
            "print(e.launcher, e.global_rank, e.world_size, e.local_rank, flush=True)")
    spec = SbatchSpec(job_name="ompi", launcher="openmpi", nodes=2, ntasks_per_node=2,
                      output=str(tmp_path / "out-%j.txt"),
                      launch=LaunchSpec(argv=(sys.executable, "-c", code), ntasks_per_node=2,
                                        ulfm=True))
    job_id = submit(sbatch_script(spec), cwd=str(REPO), env=slurm_cluster.env)
    info = wait_job(slurm_cluster, job_id, ("COMPLETED", "FAILED", "CANCELLED"))
    out = (tmp_path / f"out-{job_id}.txt").read_text()
    assert info.state == "COMPLETED", out
    rows = sorted(line.split() for line in out.splitlines() if line.startswith("openmpi"))
    assert rows == [["openmpi", str(r), "4", str(r % 2)] for r in range(4)], out


def test_usr1_warning_checkpoints_requeues_and_resumes(slurm_cluster: LocalSlurm,
                                                       tmp_path: Path) -> None:
    """The template's trap: SIGUSR1 -> ranks checkpoint and exit -> requeue -> rerun resumes."""
    code = (
        "import os, pathlib, signal, sys, time\n"
        "d = pathlib.Path(sys.argv[1]); rank = os.environ['SLURM_PROCID']\n"
        "ck = d / ('ckpt.' + rank)\n"
        "if ck.exists():\n"
        "    print('resumed', rank, ck.read_text(), os.environ['SLURM_RESTART_COUNT'], flush=True)\n"
        "    sys.exit(0)\n"
        "def on_usr1(*_):\n"
        "    ck.write_text('step7'); print('checkpointed', rank, flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGUSR1, on_usr1)\n"
        "(d / ('started.' + rank)).touch(); time.sleep(60); sys.exit(3)\n")
    spec = SbatchSpec(job_name="requeue", nodes=2, ntasks_per_node=1,
                      output=str(tmp_path / "out.txt"),
                      launch=LaunchSpec(argv=(sys.executable, "-c", code, str(tmp_path)),
                                        cpu_bind=None))
    job_id = submit(sbatch_script(spec), cwd=str(REPO), env=slurm_cluster.env)
    wait_for("both ranks started", lambda: len(list(tmp_path.glob("started.*"))) == 2)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job_id)
    wait_for("the requeue", lambda: job_info(slurm_cluster, job_id).restarts == 1)
    final = wait_job(slurm_cluster, job_id, ("COMPLETED", "FAILED"))
    out = (tmp_path / "out.txt").read_text()
    assert final.state == "COMPLETED", out
    assert "requeueing job" in out
    assert sorted(ln for ln in out.splitlines() if ln.startswith("checkpointed")) == [
        "checkpointed 0", "checkpointed 1"]
    assert sorted(ln for ln in out.splitlines() if ln.startswith("resumed")) == [
        "resumed 0 step7 1", "resumed 1 step7 1"]


def test_submitit_callable_and_command(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    submitit = pytest.importorskip("submitit")
    executor = submitit.AutoExecutor(folder=str(tmp_path / "%j"), cluster="slurm")
    executor.update_parameters(timeout_min=5, nodes=2, tasks_per_node=1, cpus_per_task=1,
                               **submitit_parameters())
    job = executor.submit(NereusEntry("nereus.cluster.env:from_os_environ"))
    envs = job.results()  # job.state is UNKNOWN here: no accounting (sacct) on this cluster
    assert all(isinstance(e, JobEnvironment) for e in envs)
    assert sorted((e.global_rank, e.node_name) for e in envs) == [(0, "n1"), (1, "n2")]
    assert {e.slurm_job_id for e in envs} == {job.job_id}
    assert {e.job_nodes for e in envs} == {("n1", "n2")}
    assert {(e.launcher, e.no_kill) for e in envs} == {("pmi", True)}  # PMI2, SLURM_NO_KILL=set
    executor.update_parameters(nodes=1)
    job = executor.submit(NereusEntry((sys.executable, "-m", "nereus", "inventory", "--json")))
    assert job.result() == 0
    stdout = job.stdout()
    report, _ = json.JSONDecoder().raw_decode(stdout, stdout.index("{"))
    assert report["nodes"][0]["node"] == "n1"


def test_submitit_preemption_checkpoint_requeue_resume(slurm_cluster: LocalSlurm,
                                                       tmp_path: Path) -> None:
    """submitit's USR2 (preemption) -> NereusEntry.checkpoint() -> requeue -> --resume."""
    submitit = pytest.importorskip("submitit")
    code = (
        "import pathlib, signal, sys, time\n"
        "d = pathlib.Path(sys.argv[1])\n"
        "if '--resume' in sys.argv:\n"
        "    print('resumed from', (d / 'ckpt').read_text(), flush=True); sys.exit(0)\n"
        "def on_signal(*_):\n"
        "    (d / 'ckpt').write_text('step3'); sys.exit(0)\n"
        "signal.signal(signal.SIGUSR1, on_signal)\n"
        "signal.signal(signal.SIGUSR2, on_signal)  # Slurm signals every process of the step\n"
        "(d / 'started').touch(); time.sleep(60); sys.exit(3)\n")
    executor = submitit.AutoExecutor(folder=str(tmp_path / "%j"), cluster="slurm")
    executor.update_parameters(timeout_min=5, nodes=1, tasks_per_node=1, cpus_per_task=1)
    job = executor.submit(NereusEntry((sys.executable, "-c", code, str(tmp_path)), grace_s=20))
    wait_for("the command to start", (tmp_path / "started").exists)
    time.sleep(0.5)  # submitit's USR2 handler is installed before the command starts
    slurm_cluster.run("scancel", f"--signal={int(signal.SIGUSR2)}", job.job_id)
    assert job.result() == 0
    assert (tmp_path / "ckpt").read_text() == "step3"
    assert "resumed from step3" in job.stdout()
    assert job_info(slurm_cluster, job.job_id).restarts == 1


def test_node_down_and_resume_seen_by_watcher(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    """A 3-node --no-kill job: n3 down -> NodesLost(n3) and a 2-node pool; the step relaunches
    on n1, n2; n3 resumed -> NodesGained(n3) (idle, outside the shrunken allocation)."""
    driver = SUPPORT / "slurm_watch_driver.py"
    # "direct": the driver runs in the batch shell and starts its own srun steps.
    spec = SbatchSpec(job_name="watch", launcher="direct", nodes=3, ntasks_per_node=1,
                      output=str(tmp_path / "out.txt"),
                      launch=LaunchSpec(argv=(sys.executable, str(driver), str(tmp_path))))
    script = sbatch_script(spec)
    job_id = submit(script, cwd=str(REPO), env=slurm_cluster.env)
    events_path = tmp_path / "events.jsonl"

    def events() -> list[dict[str, object]]:
        if not events_path.exists():
            return []
        return [json.loads(ln) for ln in events_path.read_text().splitlines() if ln.strip()]

    try:
        wait_for("three ranks started", lambda: len(list(tmp_path.glob("started.*"))) == 3)
        slurm_cluster.run("scontrol", "update", "nodename=n3", "state=down", "reason=test")
        wait_for("the watcher to see n3 lost", lambda: any(
            e["type"] == "NodesLost" and e["source"] == "watcher" for e in events()))
        assert job_info(slurm_cluster, job_id).nodes == ("n1", "n2")
        sinfo = slurm_cluster.run("sinfo", "-h", "-N", "-o", SINFO_NODE_FORMAT).stdout
        states = {n.name: (n.usable, n.reason) for n in parse_sinfo_nodes(sinfo)}
        assert states == {"n1": (True, ""), "n2": (True, ""), "n3": (False, "test")}, sinfo
        slurm_cluster.run("scontrol", "update", "nodename=n3", "state=resume")
        wait_for("the watcher to see n3 back", lambda: any(
            e["type"] == "NodesGained" for e in events()))
        (tmp_path / "release").touch()
        info = wait_job(slurm_cluster, job_id, ("COMPLETED", "FAILED"))
    finally:
        (tmp_path / "release").touch()
        slurm_cluster.resume_all()
    out = (tmp_path / "out.txt").read_text()
    assert info.state == "COMPLETED", out
    got = events()
    watcher = [(e["type"], e.get("nodes")) for e in got if e["source"] == "watcher"]
    assert watcher[0] == ("PoolChanged", ["n1", "n2", "n3"])
    assert ("NodesLost", ["n3"]) in watcher
    assert ("PoolChanged", ["n1", "n2"]) in watcher
    assert ("NodesGained", ["n3"]) in watcher
    lost = next(e for e in got if e["type"] == "NodesLost" and e["source"] == "watcher")
    assert "test" in str(lost["reason"])  # the down reason from scontrol show node
    gained = next(e for e in got if e["type"] == "NodesGained")
    assert gained["in_allocation"] is False
    srun = [(e["type"], e.get("nodes"), e.get("global_ranks")) for e in got
            if e["source"] == "srun"]
    assert ("NodesLost", ["n3"], None) in srun
    assert ("TasksFailed", None, [2]) in srun
    assert (tmp_path / "relaunch.rc").read_text().strip() == "0"
    relaunched = sorted(ln for ln in out.splitlines() if ln.startswith("relaunch"))
    assert relaunched == ["relaunch 0 n1", "relaunch 1 n2"]
    done = sorted(ln for ln in out.splitlines() if ln.startswith("step1 done"))
    assert done == ["step1 done 0 n1", "step1 done 1 n2"]  # the survivors ran on (--no-kill)


def test_node_crash_seen_by_watcher_and_srun(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    """All processes of n3 killed (slurmd, slurmstepd, tasks): srun reports its task killed at
    once; after SlurmdTimeout (10 s) n3 is not responding -> NodesLost, while the job's NodeList
    still names it; its slurmd restarted -> NodesGained(in_allocation=True)."""
    code = ("import os, time; print('up', os.environ['SLURM_PROCID'], flush=True); "
            "time.sleep(60)")
    spec = SbatchSpec(job_name="crash", nodes=3, ntasks_per_node=1,
                      output=str(tmp_path / "out.txt"),
                      launch=LaunchSpec(argv=(sys.executable, "-c", code), cpu_bind=None))
    job_id = submit(sbatch_script(spec), cwd=str(REPO), env=slurm_cluster.env)
    out = tmp_path / "out.txt"
    watcher = SlurmWatcher(job_id, runner=make_subprocess_runner(env=slurm_cluster.env))
    try:
        wait_for("three ranks up", lambda: out.exists() and out.read_text().count("up ") == 3)
        assert watcher.poll() == (PoolChanged(("n1", "n2", "n3")),)
        killed_at = time.monotonic()
        assert len(slurm_cluster.kill_node("n3")) >= 2  # slurmd and at least the task
        wait_for("srun to report the task", lambda: "n3: task 2: Killed" in out.read_text())
        events = poll_until(watcher, NodesLost)
        lost_after_s = time.monotonic() - killed_at
        lost = next(e for e in events if isinstance(e, NodesLost))
        assert lost.nodes == ("n3",) and "not_responding" in lost.reason
        assert 5.0 < lost_after_s < 40.0  # SlurmdTimeout=10 s, pinged in between
        assert PoolChanged(("n1", "n2")) in events
        assert "n3" in job_info(slurm_cluster, job_id).nodes  # still allocated to the job
        slurm_cluster.start_slurmd("n3")
        events = poll_until(watcher, NodesGained)
        assert NodesGained(("n3",), in_allocation=True) in events
    finally:
        slurm_cluster.start_slurmd("n3")
        slurm_cluster.run("scancel", job_id, check=False)
        slurm_cluster.resume_all()
        slurm_cluster.wait_idle(3, timeout_s=60)

def test_allocation_shrunk_by_scontrol(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    """`scontrol update JobId=X NumNodes=2` releases n3: NodesLost("left the allocation"), and a
    step sized from the watcher's pool runs on the two nodes left."""
    code = ("import os, pathlib, sys, time; d = pathlib.Path(sys.argv[1]); "
            "(d / ('up.' + os.environ['SLURM_PROCID'])).touch(); t = time.monotonic()\n"
            "while not (d / 'release').exists() and time.monotonic() - t < 60: time.sleep(0.1)")
    step = LaunchSpec(argv=(sys.executable, "-c", code, str(tmp_path)), cpu_bind=None)
    after = on_survivors(LaunchSpec(argv=("hostname",), ntasks_per_node=1, cpu_bind=None,
                                    label=True), ("n1", "n2"))
    spec = SbatchSpec(job_name="shrink", nodes=3, ntasks_per_node=1,
                      output=str(tmp_path / "out.txt"), launch=step)
    # The first step ends non-zero (its n3 task was killed); the job's status is the relaunch's.
    script = sbatch_script(spec).replace('exit "$rc"\n', " ".join(srun_argv(after)) + "\n")
    job_id = submit(script, cwd=str(tmp_path), env=slurm_cluster.env)
    watcher = SlurmWatcher(job_id, runner=make_subprocess_runner(env=slurm_cluster.env))
    try:
        wait_for("three ranks up", lambda: len(list(tmp_path.glob("up.*"))) == 3)
        assert watcher.poll() == (PoolChanged(("n1", "n2", "n3")),)
        slurm_cluster.run("scontrol", "update", f"JobId={job_id}", "NumNodes=2")
        events = poll_until(watcher, NodesLost)
        assert events[:2] == [NodesLost(("n3",), "left the allocation"),
                              PoolChanged(("n1", "n2"))]
        (tmp_path / "release").touch()
        info = wait_job(slurm_cluster, job_id, ("COMPLETED", "FAILED"))
    finally:
        (tmp_path / "release").touch()
        slurm_cluster.run("scancel", job_id, check=False)
    out = (tmp_path / "out.txt").read_text()
    assert "n3: task 2: Killed" in out
    assert info.state == "COMPLETED" and "0: " in out and "1: " in out, out

def test_cpu_template_runs_nereus_run(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    """The committed slurm/cpu.sbatch itself, on the tiny CPU example (issue 7's "submit the
    sbatch template and see the job finish")."""
    log = tmp_path / "run.h5"
    res = slurm_cluster.run(
        "sbatch", "--parsable", f"--output={tmp_path}/out.txt", "--time=00:05:00",
        str(REPO / "slurm" / "cpu.sbatch"), str(REPO / "examples" / "ppo-tiny-cpu.yaml"),
        "--steps", "4", "--log", str(log))
    job_id = res.stdout.strip().split(";")[0]
    info = wait_job(slurm_cluster, job_id, ("COMPLETED", "FAILED", "CANCELLED"), timeout_s=150)
    assert info.state == "COMPLETED", (tmp_path / "out.txt").read_text()[-3000:]
    from nereus.log.reader import read_run_log

    assert len(read_run_log(log).steps["step"]) == 4


FAILURE_JOB = """
job: {algorithm: ppo, mode: sync, global_batch: 12, minibatches: 2, prompt_len: 8, gen_len: 16,
      reward_model: true}
models: {actor: tiny-gpt, critic: tiny-gpt, reference: tiny-gpt, reward: tiny-gpt}
cluster: {nodes: 3, gpus_per_node: 2, gpu: cpu, memory_per_gpu_gb: 0.5}
"""


@pytest.mark.timeout(480)
def test_node_down_during_nereus_run_replans_on_two_nodes(slurm_cluster: LocalSlurm,
                                                          tmp_path: Path) -> None:
    """slurm/cpu.sbatch on 3 nodes x 2 ranks; after step 1 is logged, `scontrol update
    nodename=n3 state=down`: rank 0's watcher sees n3 lost, the pool shrinks to nodes n1-n2, the
    controller replans on the urgent path and the run finishes all its steps there."""
    from nereus.log.reader import read_run_log

    cfg = tmp_path / "job.yaml"
    cfg.write_text(FAILURE_JOB + f"runtime: {{steps: 5, save_state: {tmp_path / 'run.npz'}}}\n")
    log = tmp_path / "run.h5"
    res = slurm_cluster.run(
        "sbatch", "--parsable", f"--output={tmp_path}/out.txt", "--time=00:08:00", "--nodes=3",
        "--ntasks-per-node=2", str(REPO / "slurm" / "cpu.sbatch"), str(cfg), "--log", str(log),
        "--json")
    job_id = res.stdout.strip().split(";")[0]

    def steps_logged() -> int:
        try:
            return len(read_run_log(log).steps["step"])
        except Exception:  # not created yet, or caught between writes
            return 0

    try:
        wait_for("step 1 in the run log", lambda: steps_logged() >= 1, timeout_s=300)
        slurm_cluster.run("scontrol", "update", "nodename=n3", "state=down", "reason=test")
        info = wait_job(slurm_cluster, job_id, ("COMPLETED", "FAILED", "CANCELLED"),
                        timeout_s=300)
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
        slurm_cluster.resume_all()
    out = (tmp_path / "out.txt").read_text()
    assert info.state == "COMPLETED", out[-3000:]
    run = read_run_log(log)
    assert list(run.steps["step"]) == [0, 1, 2, 3, 4]
    kinds = list(run.events["kind"])
    details = list(run.events["detail"])
    lost = [d for k, d in zip(kinds, details, strict=True) if k == "slurm-nodes-lost"]
    assert lost and lost[0]["nodes"] == ["n3"], kinds
    pool = [(s, d) for s, k, d in zip(run.events["step"], kinds, details, strict=True)
            if k == "gpu-pool-change"]
    assert pool and pool[0][1]["pool"] == [0, 1, 2, 3]
    tr = run.tables["transitions"]
    after = [plan for s, plan in zip(tr["step"], tr["plan"], strict=True) if s >= pool[0][0]]
    assert after, "no replan after the pool change"  # the urgent path onto nodes n1-n2
    assert {g for sp in after[0]["stages"] for r in sp["replicas"] for g in r} <= {0, 1, 2, 3}
    assert list(run.steps["pool_gpus"])[-1] == 4
    # Logical state preserved: the same job without Slurm and without the loss (same seed,
    # same samples) ends with the same rewards, lengths, losses and parameters.
    ref_cfg = tmp_path / "ref.yaml"
    ref_cfg.write_text(FAILURE_JOB + f"runtime: {{steps: 5, save_state: {tmp_path / 'ref.npz'}}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    ref = subprocess.run([sys.executable, "-m", "nereus", "run", str(ref_cfg), "--log",
                          str(tmp_path / "ref.h5"), "--json"], capture_output=True, text=True,
                         cwd=REPO, env=env, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    from support.failure_runs import same_training

    base = json.loads(ref.stdout.strip().splitlines()[-1])
    got = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
    same_training(base, got, np.load(tmp_path / "ref.npz"), np.load(tmp_path / "run.npz"))


@pytest.mark.timeout(600)
def test_mpi_runtime_death_relaunches_on_the_nodes_slurm_keeps(slurm_cluster: LocalSlurm,
                                                               tmp_path: Path) -> None:
    """slurm/cpu.sbatch on 3 nodes x 2 ranks with a checkpoint every step. 0.3 s into step 2
    the ranks of n3 die and take Open MPI's runtime with them (every rank of the job ends, as
    when a real node's daemon is lost); the test then marks n3 down, as Slurm does for a dead
    node. `nereus run` sees the runtime gone, asks Slurm which nodes are left (n1, n2),
    relaunches on their 4 ranks from the checkpoint before step 2 and finishes the job."""
    from nereus.log.reader import read_run_log

    cfg = tmp_path / "job.yaml"
    cfg.write_text(FAILURE_JOB + "runtime: {steps: 4, failures: {checkpoint_every: 1, kill: "
                   "[{node: 2, at_step: 2, after_s: 0.3, runtime: true}]}}\n")
    log = tmp_path / "run.h5"
    res = slurm_cluster.run(
        "sbatch", "--parsable", f"--output={tmp_path}/out.txt", "--time=00:09:00", "--nodes=3",
        "--ntasks-per-node=2", str(REPO / "slurm" / "cpu.sbatch"), str(cfg), "--log", str(log))
    job_id = res.stdout.strip().split(";")[0]
    kills = Path(f"{log}.kills")
    try:
        wait_for("the runtime-killing death", kills.exists, timeout_s=360)
        slurm_cluster.run("scontrol", "update", "nodename=n3", "state=down", "reason=test")
        info = wait_job(slurm_cluster, job_id, ("COMPLETED", "FAILED", "CANCELLED"),
                        timeout_s=360)
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
        slurm_cluster.resume_all()
    out = (tmp_path / "out.txt").read_text()
    assert info.state == "COMPLETED", out[-3000:]
    told = [ln for ln in out.splitlines() if "relaunch 1/1" in ln]
    assert len(told) == 1 and "nodes lost: n3 (Slurm)" in told[0], out[-3000:]
    assert list(read_run_log(log).steps["step"]) == [0, 1]
    second = read_run_log(tmp_path / "run.relaunch-1.h5")
    assert list(second.steps["step"]) == [2, 3]
    assert list(second.steps["pool_gpus"]) == [4, 4]
