"""The Slurm watch hand-over to the ranks and lost nodes as run events (no Slurm needed).

The watcher's queries run through a recorded ``scontrol`` transcript (the runner seam of
``SlurmWatcher``); the live path is tests/slurm/test_slurm_cluster.py's node-down test.
"""

from __future__ import annotations

from typing import Any

from nereus.cluster.env import WATCH_CONF, WATCH_JOB, WATCH_NODES, watch_target, watch_variables
from nereus.config.run import Event
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
    names = node_indices(target, 3)
    assert names == {"n1": 0, "n2": 1, "n3": 2}
    assert ce.lost(3) == {}
    assert ce.lost(3) == {"n3": 2}
    assert ce.lost(3) == {}  # reported once
    assert calls[0][:4] == ["scontrol", "show", "job", "-o"]


class OneLoss:
    """A Slurm watch that reports node n3 (virtual node 1 of a 2-node run) lost once."""

    job_id = "42"

    def __init__(self) -> None:
        self.polls = 0

    def lost(self, nodes: int) -> dict[str, int]:
        self.polls += 1
        return {"n3": 1} if self.polls == 2 else {}


def test_rank_zero_turns_a_lost_node_into_a_remove_node_event_and_a_smaller_pool() -> None:
    from pathlib import Path

    from nereus.config.load import load_config
    from nereus.config.run import parse_runtime
    from nereus.runtime.rank0.controller import RankZeroController
    from nereus.runtime.rank0.loop import RankZero

    example = Path(__file__).resolve().parents[2] / "examples" / "ppo-tiny-cpu.yaml"
    cfg = load_config(str(example))
    rc, setup = parse_runtime({**cfg.section("runtime"), "events": []}, cfg.setup, ranks=8)
    ctl = RankZeroController(setup, adapt=True)
    ctl.set_pool(range(8))
    rz = RankZero(ctl, recorder=None, rc=rc, cluster=OneLoss())  # type: ignore[arg-type]
    gathered = [{"rank": r, "step_s": 1.0, "stage_s": {}, "peak_bytes": 0, "oom": [],
                 "len_mean": 8.0, "len_p95": 9.0} for r in range(8)]
    first = rz.observe(0, gathered)
    assert first.events == [] and first.pool == tuple(range(8))
    seen = rz.observe(1, gathered)
    assert rz.rc.events == (Event(1, "remove_node", 1),)
    assert seen.events[0] == ("slurm-nodes-lost", {"nodes": ["n3"], "job": "42"})
    assert seen.events[1][0] == "gpu-pool-change"
    assert seen.pool == (0, 1, 2, 3) and seen.obs.pool == (0, 1, 2, 3)
