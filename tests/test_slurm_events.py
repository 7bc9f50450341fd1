"""The Slurm watch hand-over to the ranks and lost nodes as run events (no Slurm needed).

The watcher's queries run through a recorded ``scontrol`` transcript (the runner seam of
``SlurmWatcher``); the live path is tests/test_slurm_cluster.py's node-down test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nereus.cluster.env import WATCH_CONF, WATCH_JOB, WATCH_NODES, watch_target, watch_variables
from nereus.config.run import Event, RunConfig
from nereus.runtime.rank0.cluster_events import ClusterEvents, node_indices

JOB_ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_STEP_ID": "0",
           "SLURM_PROCID": "0", "SLURM_NTASKS": "6", "SLURM_STEP_NODELIST": "n[1-3]",
           "SLURM_CONF": "/etc/x/slurm.conf", "PATH": "/bin"}


def test_watch_variables_survive_the_slurm_stripping() -> None:
    handed = watch_variables(JOB_ENV)
    assert handed == {WATCH_JOB: "42", WATCH_NODES: "n1,n2,n3", WATCH_CONF: "/etc/x/slurm.conf"}
    rank_env = {k: v for k, v in JOB_ENV.items() if not k.startswith("SLURM_")} | handed
    target = watch_target(rank_env)
    assert target is not None and target.job_id == "42" and target.nodes == ("n1", "n2", "n3")
    env = dict(target.command_env)
    assert env["SLURM_CONF"] == "/etc/x/slurm.conf" and WATCH_JOB not in env
    assert watch_variables({"PATH": "/bin"}) == {} and watch_target({"PATH": "/bin"}) is None


def _job(nodes: str) -> str:
    return f"JobId=42 JobName=x JobState=RUNNING NodeList={nodes} NumNodes=3\n"


def _node(name: str, state: str) -> str:
    return f"NodeName={name} State={state} Reason=test\n"


@dataclass
class FakeLog:
    events: list[tuple[int, str, Any]] = field(default_factory=list)

    def log_event(self, step: int, kind: str, detail: Any) -> None:
        self.events.append((step, kind, detail))


@dataclass
class FakeRecorder:
    rc: RunConfig
    log: FakeLog


def test_lost_node_becomes_a_remove_node_event_once() -> None:
    target = watch_target(JOB_ENV)
    assert target is not None
    ce = ClusterEvents(target)
    answers = [
        [_job("n[1-3]"), "".join(_node(n, "IDLE") for n in ("n1", "n2", "n3"))],
        [_job("n[1-2]"), _node("n1", "IDLE") + _node("n2", "IDLE") + _node("n3", "DOWN")],
        [_job("n[1-2]"), _node("n1", "IDLE") + _node("n2", "IDLE") + _node("n3", "DOWN")],
    ]
    calls: list[list[str]] = []

    def runner(argv: Any) -> str:
        calls.append(list(argv))
        return answers[(len(calls) - 1) // 2][(len(calls) - 1) % 2]

    ce.watcher.runner = runner
    rec = FakeRecorder(RunConfig(ranks=6), FakeLog())
    names = node_indices(target, 3)
    assert names == {"n1": 0, "n2": 1, "n3": 2}
    assert ce.apply(rec, 0, names) == []
    assert ce.apply(rec, 1, names) == ["n3"]
    assert rec.rc.events == (Event(1, "remove_node", 2),)
    assert rec.log.events == [(1, "slurm-nodes-lost", {"nodes": ["n3"], "job": "42"})]
    assert ce.apply(rec, 2, names) == []  # reported once
    assert calls[0][:4] == ["scontrol", "show", "job", "-o"]
