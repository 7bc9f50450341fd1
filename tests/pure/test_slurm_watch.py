"""nereus.cluster.slurm_watch: parsers on output recorded from Slurm 22.05 (local 3-node
cluster), state diffing, and the watcher driven by a scripted runner (the real-cluster run is in
test_slurm_cluster.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus.cluster.slurm_watch import (
    JobStateChanged,
    NodeInfo,
    NodesGained,
    NodesLost,
    PoolChanged,
    PoolSnapshot,
    SlurmQueryError,
    SlurmWatcher,
    TasksFailed,
    compress_nodes,
    diff_snapshots,
    expand_nodes,
    parse_job_record,
    parse_node_records,
    parse_node_state,
    parse_scontrol_record,
    parse_sinfo_nodes,
    parse_srun_stderr_line,
    snapshot,
)
from nereus.errors import ConfigError

JOB_RUNNING = "JobId=1 JobName=job.sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:03 TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-12-01T08:28:27 EligibleTime=2026-12-01T08:28:27 AccrueTime=2026-12-01T08:28:27 StartTime=2026-12-01T08:28:27 EndTime=2027-12-01T08:28:27 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-01T08:28:27 Scheduler=Backfill Partition=debug AllocNode:Sid=localhost:3475 ReqNodeList=(null) ExcNodeList=(null) NodeList=n[1-3] BatchHost=n1 NumNodes=3 NumCPUs=3 NumTasks=3 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=3,node=3,billing=3 Socks/Node=* NtasksPerN:B:S:C=1:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/x/job.sh WorkDir=/tmp/x StdErr=/tmp/x/out.txt StdIn=/dev/null StdOut=/tmp/x/out.txt Power= "
# The same job one second after `scontrol update nodename=n3 state=down reason=test`.
JOB_SHRUNK = JOB_RUNNING.replace("NodeList=n[1-3]", "NodeList=n[1-2]").replace(
    "NumNodes=3", "NumNodes=2")
JOB_PENDING = "JobId=7 JobName=t3 UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901755 Nice=0 Account=(null) QOS=(null) JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=365-00:00:00 NodeList=(null) NumNodes=2 "
NODE_N1 = "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=0.41 AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=vm Port=17001 Version=22.05.8 OS=Linux 6.18.44-fc-v1045 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=22054 Sockets=2 Boards=1 State=MIXED ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  BootTime=2026-12-01T08:19:13 SlurmdStartTime=2026-12-01T08:28:21 LastBusyTime=2026-12-01T08:28:22 CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES=cpu=1 CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s"
NODE_N2 = NODE_N1.replace("NodeName=n1", "NodeName=n2").replace("Port=17001", "Port=17002")
NODE_N3 = NODE_N1.replace("NodeName=n1", "NodeName=n3").replace("Port=17001", "Port=17003")
# scontrol prints Reason= last on the line.
NODE_N3_DOWN = (NODE_N3.replace("State=MIXED", "State=DOWN")
                + " Reason=test [root@2026-12-01T08:28:30]")
NODE_N2_DRAIN = (NODE_N2.replace("State=MIXED", "State=IDLE+DRAIN")
                 + " Reason=drain test [root@2026-12-01T08:31:37]")
NODE_N3_IDLE = NODE_N3.replace("State=MIXED", "State=IDLE")
# srun's stderr when n3 went down under `srun --no-kill` (the survivors ran on).
SRUN_STDERR = """srun: error: Node failure on n3
srun: error: n3: task 2: Killed
srun: Force Terminated StepId=2.0
srun: error: n2: tasks 4-5,7: Exited with exit code 1
"""


def test_hostlists() -> None:
    assert expand_nodes("n[1-3],gpu07") == ("n1", "n2", "n3", "gpu07")
    assert expand_nodes("(null)") == () and expand_nodes("") == ()
    assert compress_nodes(["n1", "n2", "n3"]) == "n[1-3]"
    with pytest.raises(ConfigError):
        expand_nodes("n[1-")


@given(st.sets(st.integers(0, 999), min_size=1, max_size=40))
def test_hostlist_roundtrip(ids: set[int]) -> None:
    nodes = tuple(f"gpu{i:03d}" for i in sorted(ids))
    assert expand_nodes(compress_nodes(nodes)) == nodes


def test_scontrol_record_values_with_spaces_and_odd_keys() -> None:
    rec = parse_scontrol_record(NODE_N3_DOWN)
    assert rec["OS"] == "Linux 6.18.44-fc-v1045 #1 SMP PREEMPT_DYNAMIC @0"
    assert rec["Reason"] == "test [root@2026-12-01T08:28:30]"
    assert rec["CfgTRES"] == "cpu=2,mem=1000M,billing=2"
    job = parse_scontrol_record(JOB_RUNNING)
    assert job["AllocNode:Sid"] == "localhost:3475" and job["CPUs/Task"] == "1"
    assert job["Power"] == ""


def test_job_records() -> None:
    running = parse_job_record(JOB_RUNNING)
    assert (running.job_id, running.state, running.nodes) == ("1", "RUNNING", ("n1", "n2", "n3"))
    assert parse_job_record(JOB_SHRUNK).nodes == ("n1", "n2")
    pending = parse_job_record(JOB_PENDING)
    assert (pending.state, pending.nodes, pending.restarts, pending.reason) == (
        "PENDING", (), 1, "BeginTime")
    with pytest.raises(SlurmQueryError):
        parse_job_record("slurm_load_jobs error: Invalid job id specified")


@pytest.mark.parametrize("text,state,flags,usable", [
    ("MIXED", "mixed", set(), True),
    ("IDLE+DRAIN", "idle", {"drain"}, False),
    ("ALLOCATED+DRAIN", "allocated", {"drain"}, False),
    ("DOWN*", "down", {"not_responding"}, False),
    ("IDLE*", "idle", {"not_responding"}, False),
    ("drained", "drained", {"drain"}, False),
    ("mixed+completing", "mixed", {"completing"}, True),
    ("idle~", "idle", {"powered_down"}, False),
])
def test_node_states(text: str, state: str, flags: set[str], usable: bool) -> None:
    got_state, got_flags = parse_node_state(text)
    assert (got_state, set(got_flags)) == (state, flags)
    assert NodeInfo("n", got_state, got_flags, "").usable is usable


def test_node_records_and_sinfo_agree() -> None:
    nodes = parse_node_records("\n".join([NODE_N1, NODE_N2_DRAIN, NODE_N3_DOWN]) + "\n")
    assert [(n.name, n.usable) for n in nodes] == [("n1", True), ("n2", False), ("n3", False)]
    assert nodes[2].reason == "test [root@2026-12-01T08:28:30]"
    # `sinfo -h -N -o '%N|%T|%E'` recorded at the same moment (n1 listed twice: two partitions)
    sinfo = parse_sinfo_nodes("n1|mixed|none\nn2|drained|drain test\nn3|down|test\n"
                              "n1|mixed|none\n")
    assert [(n.name, n.usable, n.reason) for n in sinfo] == [
        ("n1", True, ""), ("n2", False, "drain test"), ("n3", False, "test")]
    with pytest.raises(SlurmQueryError):
        parse_node_records("garbage line\n")
    with pytest.raises(SlurmQueryError):
        parse_sinfo_nodes("n1 idle none\n")


def test_srun_stderr_lines() -> None:
    events = [parse_srun_stderr_line(ln) for ln in SRUN_STDERR.splitlines()]
    assert events == [
        NodesLost(("n3",), "srun: node failure"),
        TasksFailed("n3", (2,), "Killed"),
        None,
        TasksFailed("n2", (4, 5, 7), "Exited with exit code 1"),
    ]
    assert parse_srun_stderr_line("srun: error: Node failure on n[2-3]") == NodesLost(
        ("n2", "n3"), "srun: node failure")
    assert parse_srun_stderr_line("step1 done 0 n1") is None


WATCHED = ("n1", "n2", "n3")


def snap(job: str, *nodes: str) -> PoolSnapshot:
    return snapshot(parse_job_record(job), parse_node_records("\n".join(nodes)), WATCHED)


def test_diff_node_down_then_back() -> None:
    before = snap(JOB_RUNNING, NODE_N1, NODE_N2, NODE_N3)
    down = snap(JOB_SHRUNK, NODE_N1, NODE_N2, NODE_N3_DOWN)
    assert before.pool == WATCHED and down.pool == ("n1", "n2")
    assert diff_snapshots(before, down) == (
        NodesLost(("n3",), "down: test [root@2026-12-01T08:28:30]"),
        PoolChanged(("n1", "n2")))
    back = snap(JOB_SHRUNK, NODE_N1, NODE_N2, NODE_N3_IDLE)
    assert diff_snapshots(down, back) == (NodesGained(("n3",), in_allocation=False),)
    assert diff_snapshots(back, back) == ()


def test_diff_drain_inside_the_allocation_and_job_end() -> None:
    before = snap(JOB_RUNNING, NODE_N1, NODE_N2, NODE_N3)
    drained = snap(JOB_RUNNING, NODE_N1, NODE_N2_DRAIN, NODE_N3)
    assert diff_snapshots(before, drained) == (
        NodesLost(("n2",), "idle+drain: drain test [root@2026-12-01T08:31:37]"),
        PoolChanged(("n1", "n3")))
    undrained = snap(JOB_RUNNING, NODE_N1, NODE_N2, NODE_N3)
    assert diff_snapshots(drained, undrained) == (
        NodesGained(("n2",), in_allocation=True), PoolChanged(WATCHED))
    ended = snap(JOB_RUNNING.replace("JobState=RUNNING", "JobState=COMPLETED"),
                 NODE_N1, NODE_N2, NODE_N3)
    assert diff_snapshots(undrained, ended) == (JobStateChanged("RUNNING", "COMPLETED"),)


def test_diff_node_missing_from_report_and_left_allocation() -> None:
    before = snap(JOB_RUNNING, NODE_N1, NODE_N2, NODE_N3)
    missing = snap(JOB_RUNNING, NODE_N1, NODE_N2)
    assert diff_snapshots(before, missing)[0] == NodesLost(("n3",), "not reported by Slurm")
    shrunk_only = snap(JOB_SHRUNK, NODE_N1, NODE_N2, NODE_N3)  # e.g. scontrol NumNodes=2
    assert diff_snapshots(before, shrunk_only)[0] == NodesLost(("n3",), "left the allocation")


class ScriptedRunner:
    """Plays back recorded scontrol outputs in order; records the commands it was given."""

    def __init__(self, outputs: Sequence[str]) -> None:
        self.outputs = list(outputs)
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(tuple(argv))
        return self.outputs.pop(0)


def test_watcher_polls_job_then_nodes() -> None:
    nodes_ok = "\n".join([NODE_N1, NODE_N2, NODE_N3])
    runner = ScriptedRunner([JOB_RUNNING, nodes_ok,
                             JOB_SHRUNK, "\n".join([NODE_N1, NODE_N2, NODE_N3_DOWN]),
                             JOB_SHRUNK, "\n".join([NODE_N1, NODE_N2, NODE_N3_IDLE])])
    watcher = SlurmWatcher("1", runner=runner)
    assert watcher.poll() == (PoolChanged(WATCHED),)
    assert runner.calls == [("scontrol", "show", "job", "-o", "1"),
                            ("scontrol", "show", "node", "-o", "n[1-3]")]
    lost = watcher.poll()
    assert NodesLost(("n3",), "down: test [root@2026-12-01T08:28:30]") in lost
    assert watcher.poll() == (NodesGained(("n3",), in_allocation=False),)
    assert runner.calls[-1] == ("scontrol", "show", "node", "-o", "n[1-3]")  # still watched


def test_watcher_reports_an_empty_answer() -> None:
    with pytest.raises(SlurmQueryError):
        SlurmWatcher("5", runner=ScriptedRunner([""])).poll()


def test_watch_loop_stops() -> None:
    nodes_ok = "\n".join([NODE_N1, NODE_N2, NODE_N3])
    runner = ScriptedRunner([JOB_RUNNING, nodes_ok, JOB_RUNNING, nodes_ok])
    polls = iter([False, False, True])
    got = list(SlurmWatcher("1", runner=runner).watch(0.0, lambda: next(polls)))
    assert got == [PoolChanged(WATCHED)]
    assert not runner.outputs
