"""Slurm allocation changes as pool events for the controller rank (effectful).

Under Slurm the controller rank polls the job with :class:`nereus.cluster.slurm_watch.
SlurmWatcher` at every step boundary. Virtual node i of the run is the i-th node of the step
(``nereus run`` lays the ranks out node by node). A ``NodesLost`` event (``scontrol update
nodename=n3 state=down``, a node that stops responding, a shrunken allocation) becomes a
``remove_node`` event of this step (:meth:`nereus.runtime.rank0.loop.RankZero.observe`): the controller sees a smaller pool and replans on the
urgent path. Ranks that Slurm actually kills are handled by ULFM (``nereus.runtime.failures.ulfm``);
this path covers the node the scheduler takes away while its ranks still run — always the
case for the emulated nodes of one host, where every rank is a child of task 0's mpiexec.
"""

from __future__ import annotations

from collections.abc import Mapping

from nereus.cluster.env import WatchTarget


class ClusterEvents:
    """Polls the Slurm job; reports the nodes it lost as virtual node indices of the run."""

    def __init__(self, target: WatchTarget) -> None:
        from nereus.cluster.slurm_watch import SlurmWatcher, make_subprocess_runner

        self.target = target
        self.job_id = target.job_id
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

    def lost(self, nodes: int) -> dict[str, int]:
        """Nodes of the run (its ``nodes`` virtual nodes) newly lost since the last poll:
        Slurm name → virtual node index."""
        node_of_name = node_indices(self.target, nodes)
        return {n: node_of_name[n] for n in self.lost_nodes() if n in node_of_name}


def cluster_events(environ: Mapping[str, str]) -> ClusterEvents | None:
    """The Slurm watch of this job (rank 0 under Slurm), or None outside Slurm."""
    from nereus.cluster.env import watch_target

    target = watch_target(environ)
    return None if target is None else ClusterEvents(target)


def node_indices(target: WatchTarget, nodes: int) -> dict[str, int]:
    """Slurm node name → virtual node index (the step's nodes in order, as many as the run's)."""
    return {name: i for i, name in enumerate(target.nodes[:nodes])}
