"""Slurm allocation changes as pool events for the controller rank (effectful).

Under Slurm the controller rank polls the job with :class:`nereus.cluster.slurm_watch.
SlurmWatcher` at every step boundary. Virtual node i of the run is the i-th node of the step
(``nereus run`` lays the ranks out node by node). A ``NodesLost`` event (``scontrol update
nodename=n3 state=down``, a node that stops responding, a shrunken allocation) becomes a
``remove_node`` event of this step: the controller sees a smaller pool and replans on the
urgent path. Ranks that Slurm actually kills are handled by ULFM (``nereus.runtime.failures.ulfm``);
this path covers the node the scheduler takes away while its ranks still run — always the
case for the emulated nodes of one host, where every rank is a child of task 0's mpiexec.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nereus.cluster.env import WatchTarget
from nereus.config.run import Event


class ClusterEvents:
    """Polls the Slurm job; turns lost nodes into ``remove_node`` run events."""

    def __init__(self, target: WatchTarget) -> None:
        from nereus.cluster.slurm_watch import SlurmWatcher, make_subprocess_runner

        self.target = target
        self.watcher = SlurmWatcher(target.job_id, watched=target.nodes,
                                    runner=make_subprocess_runner(env=dict(target.command_env)))
        self.removed: set[str] = set()
        self.errors = 0

    def lost_nodes(self) -> list[str]:
        from nereus.cluster.slurm_watch import NodesLost, SlurmQueryError

        try:
            events = self.watcher.poll()
        except SlurmQueryError:  # a slow or restarting slurmctld: try again next step
            self.errors += 1
            return []
        out = []
        for e in events:
            if isinstance(e, NodesLost):
                out += [n for n in e.nodes if n not in self.removed]
        self.removed.update(out)
        return out

    def apply(self, recorder: Any, step: int, node_of_name: dict[str, int]) -> list[str]:
        """Add a ``remove_node`` event at ``step`` to the recorder's run config for every newly
        lost node; returns their names."""
        lost = [n for n in self.lost_nodes() if n in node_of_name]
        if lost:
            extra = tuple(Event(step, "remove_node", node_of_name[n]) for n in lost)
            recorder.rc = replace(recorder.rc, events=recorder.rc.events + extra)
            recorder.log.log_event(step, "slurm-nodes-lost",
                                   {"nodes": lost, "job": self.target.job_id})
        return lost


def node_indices(target: WatchTarget, nodes: int) -> dict[str, int]:
    """Slurm node name → virtual node index (the step's nodes in order, as many as the run's)."""
    return {name: i for i, name in enumerate(target.nodes[:nodes])}
