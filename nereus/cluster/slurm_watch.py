"""Slurm allocation watching: pure parsers and state diffing, plus a thin polling watcher.

SLURM_JOB_NODELIST never changes after the job starts, so the pool is observed by polling
``scontrol show job -o JOBID`` (the job's NodeList shrinks when a node of a ``--no-kill`` job
fails) and the states of the watched nodes (``scontrol show node -o``, or ``sinfo``), and by
reading srun's stderr ("srun: error: Node failure on n3"). Observations become frozen events.
Verified on Slurm 22.05: ``scontrol update nodename=n3 state=down`` removes n3 from a running
``--no-kill`` job at once (NodeList n[1-3] -> n[1-2]) and srun prints the node failure.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from nereus.errors import ConfigError, NereusError


class SlurmQueryError(NereusError):
    """A Slurm command failed or printed something we cannot parse."""


# ---------------------------------------------------------------- host lists

def expand_nodes(nodelist: str) -> tuple[str, ...]:
    """``"n[1-3],gpu07"`` -> ``("n1", "n2", "n3", "gpu07")``; "" and "(null)" -> ()."""
    text = nodelist.strip()
    if not text or text == "(null)":
        return ()
    import hostlist  # python-hostlist (the "slurm" extra), not the "hostlist" package

    try:
        return tuple(hostlist.expand_hostlist(text))
    except hostlist.BadHostlist as exc:
        raise ConfigError("nodelist", nodelist, f"is not a Slurm host list ({exc})") from None


def compress_nodes(nodes: Iterable[str]) -> str:
    """``("n1", "n2", "n3")`` -> ``"n[1-3]"``."""
    import hostlist

    return str(hostlist.collect_hostlist(list(nodes)))


# ---------------------------------------------------------------- records

_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/.]*)=")


def parse_scontrol_record(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` line -> {key: value}; values may contain spaces."""
    matches = list(_KEY.finditer(line))
    record: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        record[match.group(1)] = line[match.end():end].strip()
    return record


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str  # "RUNNING", "PENDING", "COMPLETED", "REQUEUED", ...
    nodes: tuple[str, ...]
    restarts: int
    reason: str


def parse_job_record(line: str) -> JobInfo:
    rec = parse_scontrol_record(line.strip())
    if "JobId" not in rec or "JobState" not in rec:
        raise SlurmQueryError(f"not a 'scontrol show job -o' line: {line.strip()[:120]!r}")
    try:
        restarts = int(rec.get("Restarts", "0"))
    except ValueError:
        raise SlurmQueryError(f"job {rec['JobId']}: Restarts={rec['Restarts']!r}") from None
    return JobInfo(job_id=rec["JobId"], state=rec["JobState"],
                   nodes=expand_nodes(rec.get("NodeList", "")), restarts=restarts,
                   reason=rec.get("Reason", "None"))


# Node base states that cannot run work, and flags that take a node out of service.
_UNUSABLE_STATES = frozenset({"down", "fail", "future", "unknown", "drained", "inval"})
_UNUSABLE_FLAGS = frozenset({"drain", "draining", "drained", "fail", "failing",
                             "not_responding", "powered_down", "powering_down", "maint"})
_SINFO_SUFFIX_FLAGS = {"*": "not_responding", "~": "powered_down", "#": "powering_up",
                       "!": "powering_down", "%": "powering_down", "$": "maint",
                       "@": "reboot_requested", "^": "rebooting", "-": "planned"}


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # base state, lower case: "idle", "mixed", "allocated", "down", ...
    flags: frozenset[str]
    reason: str

    @property
    def usable(self) -> bool:
        return self.state not in _UNUSABLE_STATES and not (self.flags & _UNUSABLE_FLAGS)


def parse_node_state(text: str) -> tuple[str, frozenset[str]]:
    """``"IDLE+DRAIN"`` -> ("idle", {"drain"}); ``"down*"`` -> ("down", {"not_responding"})."""
    raw = text.strip().lower()
    flags: set[str] = set()
    while raw and raw[-1] in _SINFO_SUFFIX_FLAGS:
        flags.add(_SINFO_SUFFIX_FLAGS[raw[-1]])
        raw = raw[:-1]
    base, *rest = raw.split("+")
    flags.update(rest)
    if base in ("drained", "draining"):
        flags.add("drain")
    if not base:
        raise SlurmQueryError(f"empty node state {text!r}")
    return base, frozenset(flags)


def parse_node_records(text: str) -> tuple[NodeInfo, ...]:
    """``scontrol show node -o`` output (one node per line)."""
    nodes = []
    for line in text.splitlines():
        if not line.strip():
            continue
        rec = parse_scontrol_record(line.strip())
        if "NodeName" not in rec or "State" not in rec:
            raise SlurmQueryError(f"not a 'scontrol show node -o' line: {line.strip()[:120]!r}")
        state, flags = parse_node_state(rec["State"])
        nodes.append(NodeInfo(rec["NodeName"], state, flags, rec.get("Reason", "")))
    return tuple(nodes)


SINFO_NODE_FORMAT = "%N|%T|%E"


def parse_sinfo_nodes(text: str) -> tuple[NodeInfo, ...]:
    """``sinfo -h -N -o '%N|%T|%E'`` output; a node listed in several partitions appears once."""
    seen: dict[str, NodeInfo] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|", 2)
        if len(parts) != 3:
            raise SlurmQueryError(f"not a sinfo '{SINFO_NODE_FORMAT}' line: {line.strip()!r}")
        name, state_text, reason = parts
        state, flags = parse_node_state(state_text)
        seen.setdefault(name, NodeInfo(name, state, flags, "" if reason == "none" else reason))
    return tuple(seen.values())


# ---------------------------------------------------------------- events

@dataclass(frozen=True)
class PoolChanged:
    """The usable nodes of the allocation are now ``nodes``."""

    nodes: tuple[str, ...]


@dataclass(frozen=True)
class NodesLost:
    nodes: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class NodesGained:
    """Watched nodes that became usable: back in the allocation, or idle for a growth request."""

    nodes: tuple[str, ...]
    in_allocation: bool


@dataclass(frozen=True)
class TasksFailed:
    """srun reported tasks (global ranks) of one node as ended."""

    node: str
    global_ranks: tuple[int, ...]
    detail: str


@dataclass(frozen=True)
class JobStateChanged:
    old: str
    new: str


Event = PoolChanged | NodesLost | NodesGained | TasksFailed | JobStateChanged

_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (\S+)")
_TASK_ENDED = re.compile(r"^srun: error: (\S+): tasks? ([0-9][0-9,\-]*): (.+)$")


def _ranks_of(text: str) -> tuple[int, ...]:
    ranks: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        ranks += range(int(lo), int(hi or lo) + 1)
    return tuple(ranks)


def parse_srun_stderr_line(line: str) -> Event | None:
    """An srun stderr line -> NodesLost / TasksFailed, or None for any other line."""
    text = line.strip()
    match = _NODE_FAILURE.match(text)
    if match:
        return NodesLost(expand_nodes(match.group(1)), "srun: node failure")
    match = _TASK_ENDED.match(text)
    if match:
        return TasksFailed(match.group(1), _ranks_of(match.group(2)), match.group(3).strip())
    return None


# ---------------------------------------------------------------- state diffing

@dataclass(frozen=True)
class PoolSnapshot:
    job_state: str
    allocated: tuple[str, ...]  # the job's NodeList now
    usable: tuple[str, ...]  # watched nodes in a usable state
    reasons: tuple[tuple[str, str], ...]  # (node, why unusable) for watched unusable nodes

    @property
    def pool(self) -> tuple[str, ...]:
        usable = set(self.usable)
        return tuple(n for n in self.allocated if n in usable)


def snapshot(job: JobInfo, nodes: Sequence[NodeInfo], watched: Sequence[str]) -> PoolSnapshot:
    by_name = {n.name: n for n in nodes}
    usable, reasons = [], []
    for name in watched:
        info = by_name.get(name)
        if info is None:
            reasons.append((name, "not reported by Slurm"))
        elif info.usable:
            usable.append(name)
        else:
            label = "+".join([info.state, *sorted(info.flags)])
            reasons.append((name, f"{label}: {info.reason}" if info.reason else label))
    return PoolSnapshot(job.state, job.nodes, tuple(usable), tuple(reasons))


def diff_snapshots(old: PoolSnapshot, new: PoolSnapshot) -> tuple[Event, ...]:
    """Events that turn ``old`` into ``new`` (lost, gained, pool, job state), deterministic."""
    events: list[Event] = []
    why = dict(new.reasons)
    lost = [n for n in old.pool if n not in new.pool]
    by_reason: dict[str, list[str]] = {}
    for node in lost:
        by_reason.setdefault(why.get(node, "left the allocation"), []).append(node)
    events += [NodesLost(tuple(nodes), reason) for reason, nodes in sorted(by_reason.items())]
    back_in = tuple(n for n in new.pool if n not in old.pool)
    if back_in:
        events.append(NodesGained(back_in, in_allocation=True))
    idle_again = tuple(n for n in new.usable
                       if n not in old.usable and n not in new.allocated)
    if idle_again:
        events.append(NodesGained(idle_again, in_allocation=False))
    if new.pool != old.pool:
        events.append(PoolChanged(new.pool))
    if new.job_state != old.job_state:
        events.append(JobStateChanged(old.job_state, new.job_state))
    return tuple(events)


# ---------------------------------------------------------------- the watcher (effects)

Runner = Callable[[Sequence[str]], str]


def make_subprocess_runner(env: Mapping[str, str] | None = None, timeout_s: float = 10.0
                           ) -> Runner:
    """A runner that executes a Slurm command and returns its stdout."""

    def run(argv: Sequence[str]) -> str:
        try:
            res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                                 env=dict(env) if env is not None else None, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmQueryError(f"{' '.join(argv)}: {exc}") from None
        if res.returncode != 0:
            raise SlurmQueryError(f"{' '.join(argv)}: exit {res.returncode}: "
                                  f"{res.stderr.strip()[:200]}")
        return res.stdout

    return run


class SlurmWatcher:
    """Polls one job and its nodes; ``poll()`` returns the events since the previous poll.

    ``watched`` defaults to the job's nodes at the first poll (= SLURM_JOB_NODELIST). The first
    poll returns ``PoolChanged(pool)`` so the caller learns the starting pool.
    """

    def __init__(self, job_id: str, watched: Sequence[str] = (),
                 runner: Runner | None = None) -> None:
        self.job_id = job_id
        self.watched: tuple[str, ...] = tuple(watched)
        self.runner = runner if runner is not None else make_subprocess_runner()
        self.last: PoolSnapshot | None = None

    def observe(self) -> PoolSnapshot:
        job_text = self.runner(["scontrol", "show", "job", "-o", self.job_id])
        lines = [ln for ln in job_text.splitlines() if ln.strip()]
        if not lines:
            raise SlurmQueryError(f"scontrol printed nothing for job {self.job_id}")
        job = parse_job_record(lines[0])
        if not self.watched:
            self.watched = job.nodes
        node_text = self.runner(["scontrol", "show", "node", "-o", compress_nodes(self.watched)])
        return snapshot(job, parse_node_records(node_text), self.watched)

    def poll(self) -> tuple[Event, ...]:
        new = self.observe()
        old, self.last = self.last, new
        if old is None:
            return (PoolChanged(new.pool),)
        return diff_snapshots(old, new)

    def watch(self, interval_s: float, until: Callable[[], bool]) -> Iterator[Event]:
        """Poll every ``interval_s`` seconds and yield events until ``until()`` is true.

        Each poll is two slurmctld RPCs; on a shared production cluster poll every few seconds
        at most and rely on srun's stderr for the fast path.
        """
        while not until():
            yield from self.poll()
            time.sleep(interval_s)
