"""``runtime.failures``: checkpoints for lost state, and injected node deaths (checked here).

Keys (all optional): ``checkpoint_every`` (write the logical state every k steps so that a job
whose every replica of some model-stage died can resume; 0 = never, the default),
``checkpoint_dir`` (default: ``<log>.ckpt`` beside the run log), ``resume`` (a checkpoint
directory to start from: its newest checkpoint's state and step — the restart baseline),
``kill`` (a list of ``{node: n, at_step: k, phase: step|transition, after_s: t, runtime: b}``:
every rank of virtual node n kills itself with SIGKILL ``after_s`` seconds into step k, or into the
plan change after step k — at the latest when its part of that step or plan change ends, so the
death lands inside it on a fast machine too — real process deaths at chosen moments, for tests
and benchmarks; with
``runtime: true`` the dying ranks take the MPI runtime down with them, as when Open MPI loses the
daemon of a dead node and ends the whole job), ``relaunch`` (how many times ``nereus run`` starts
the job again on the surviving nodes from the newest checkpoint when the MPI runtime itself died;
default 1 when ``checkpoint_every`` > 0, else 0; > 0 needs ``checkpoint_every`` > 0),
``relaunch_wait_s`` (under Slurm, how long the launcher waits for the scheduler to report the
failed node before relaunching on every node of the step; default 60), ``launch_retries`` (how
many times ``nereus run`` starts the same launch again on the same nodes and log when the MPI
runtime died before any rank wrote the run log: nothing ran, so no checkpoint is needed; default
2, counted apart from ``relaunch``), ``warning_s`` (after a preemption warning, SIGUSR1 or
SIGUSR2, the time the ranks have to write their checkpoint; default 60: Slurm's
``--signal=B:USR1@120`` of the templates and submitit's ``USR2@90`` leave more) and
``kill_wait_s`` (the same after SIGTERM: Slurm's ``KillWait``, default 30) — see
:mod:`nereus.runtime.failures.preemption`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nereus.config import fields as f
from nereus.errors import ConfigError

KEYS = ("checkpoint_every", "checkpoint_dir", "resume", "kill", "relaunch", "relaunch_wait_s",
        "launch_retries", "warning_s", "kill_wait_s")
LAUNCH_RETRIES = 2  # start-up deaths of the MPI runtime retried by default
KILL_KEYS = ("node", "at_step", "phase", "after_s", "runtime")
PHASES = ("step", "transition")


@dataclass(frozen=True)
class Kill:
    node: int
    at_step: int
    phase: str = "step"
    after_s: float = 0.0
    runtime: bool = False  # the MPI runtime dies too (Open MPI losing a node's daemon)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "at_step": self.at_step, "phase": self.phase,
                "after_s": self.after_s, "runtime": self.runtime}


@dataclass(frozen=True)
class FailureOptions:
    checkpoint_every: int = 0
    checkpoint_dir: str = ""
    resume: str = ""
    kill: tuple[Kill, ...] = ()
    relaunch: int = 0
    relaunch_wait_s: float = 60.0
    launch_retries: int = LAUNCH_RETRIES
    warning_s: float = 60.0
    kill_wait_s: float = 30.0

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint_every": self.checkpoint_every, "checkpoint_dir": self.checkpoint_dir,
                "resume": self.resume, "kill": [k.to_dict() for k in self.kill],
                "relaunch": self.relaunch, "relaunch_wait_s": self.relaunch_wait_s,
                "launch_retries": self.launch_retries, "warning_s": self.warning_s,
                "kill_wait_s": self.kill_wait_s}

    @staticmethod
    def from_dict(d: Any) -> FailureOptions:
        if not d:
            return FailureOptions()
        return FailureOptions(int(d["checkpoint_every"]), str(d["checkpoint_dir"]),
                              str(d["resume"]),
                              tuple(Kill(int(k["node"]), int(k["at_step"]), str(k["phase"]),
                                         float(k["after_s"]), bool(k.get("runtime", False)))
                                    for k in d["kill"]),
                              int(d.get("relaunch", 0)), float(d.get("relaunch_wait_s", 60.0)),
                              int(d.get("launch_retries", LAUNCH_RETRIES)),
                              float(d.get("warning_s", 60.0)), float(d.get("kill_wait_s", 30.0)))

    def kills_at(self, node: int, step: int, phase: str) -> list[Kill]:
        return [k for k in self.kill if (k.node, k.at_step, k.phase) == (node, step, phase)]


def parse_failures(raw: Any, nodes: int, steps: int) -> FailureOptions:
    if raw is None:
        return FailureOptions()
    path = "runtime.failures"
    raw = f.mapping(path, raw, KEYS)
    every = f.non_negative_int(f.join(path, "checkpoint_every"), raw.get("checkpoint_every", 0))
    kills = []
    kill_raw = raw.get("kill", [])
    if not isinstance(kill_raw, list):
        raise ConfigError(f.join(path, "kill"), kill_raw, "must be a list")
    for i, k in enumerate(kill_raw):
        kp = f"{path}.kill[{i}]"
        k = f.mapping(kp, k, KILL_KEYS)
        node = f.non_negative_int(f.join(kp, "node"), k.get("node"))
        if node >= nodes:
            raise ConfigError(f.join(kp, "node"), node, f"must be < nodes={nodes}")
        at = f.non_negative_int(f.join(kp, "at_step"), k.get("at_step"))
        if at >= steps:
            raise ConfigError(f.join(kp, "at_step"), at, f"must be < steps={steps}")
        phase = f.choice(f.join(kp, "phase"), k.get("phase", "step"), PHASES)
        after = f.non_negative_float(f.join(kp, "after_s"), k.get("after_s", 0.0),
                                     "MAX_TIMEOUT_S")
        runtime = k.get("runtime", False)
        if not isinstance(runtime, bool):
            raise ConfigError(f.join(kp, "runtime"), runtime, "must be true or false")
        kills.append(Kill(node, at, phase, after, runtime))
    relaunch = f.non_negative_int(f.join(path, "relaunch"),
                                  raw.get("relaunch", 1 if every > 0 else 0))
    if relaunch and not every:
        raise ConfigError(f.join(path, "relaunch"), relaunch,
                          "needs checkpoint_every > 0 (a relaunch resumes from a checkpoint)")
    wait_s = f.non_negative_float(f.join(path, "relaunch_wait_s"),
                                  raw.get("relaunch_wait_s", 60.0), "MAX_TIMEOUT_S")
    retries = f.non_negative_int(f.join(path, "launch_retries"),
                                 raw.get("launch_retries", LAUNCH_RETRIES))
    warning_s = f.positive_float(f.join(path, "warning_s"), raw.get("warning_s", 60.0),
                                 "MAX_TIMEOUT_S")
    kill_wait_s = f.positive_float(f.join(path, "kill_wait_s"), raw.get("kill_wait_s", 30.0),
                                   "MAX_TIMEOUT_S")
    return FailureOptions(every, f.optional_path(path, raw, "checkpoint_dir"),
                          f.optional_path(path, raw, "resume"),
                          tuple(kills), relaunch, wait_s, retries, warning_s, kill_wait_s)
