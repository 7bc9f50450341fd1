"""Relaunch on the surviving nodes when the MPI runtime itself died (launcher side, effectful).

ULFM keeps a job alive when ranks die while Open MPI's runtime lives
(:mod:`nereus.runtime.failures.recovery`). When the runtime dies with a node — Open MPI loses the
daemon of a dead host and ends the whole job — no rank is left to carry on. ``nereus run`` (the
parent of ``mpiexec``) then:

1. classifies the exit (:func:`runtime_died`): mpiexec ended abnormally and no rank reported an
   error of its own (no ``NEREUS-RANK-ERROR`` line, no agreed exit 2/3) — or the survivors of a
   death reported that ULFM could not shrink their communicator (:func:`recovery_failed`);
2. finds the surviving nodes (:func:`surviving_nodes`): under Slurm, the step's nodes that are
   still in the allocation and usable according to ``scontrol``, waiting up to
   ``runtime.failures.relaunch_wait_s`` for the scheduler to report the failure (none reported:
   every node of the step); without Slurm (one host), every configured node except those whose
   ranks recorded an injected death with ``runtime: true`` in ``<log>.kills``;
3. derives a config for the survivors (:func:`survivor_config`): ``cluster.nodes`` = their count,
   ``runtime.failures.resume`` = the checkpoint directory (its newest checkpoint), injected kills
   and node events of lost nodes dropped and the others renumbered onto the survivors;
4. starts mpiexec again on the survivors with a new log segment ``<log>.relaunch-K.h5``.

Steps after the newest checkpoint are redone; same seed, same samples, so training ends where an
undisturbed run ends (up to floating-point reduction order on the smaller plan).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

KILLS_SUFFIX = ".kills"
# what survivors report when ULFM could not give them a communicator (every rank ends): only a
# relaunch from the checkpoint can go on
SHRINK_FAILED = "the survivors could not shrink the MPI communicator"


def runtime_died(exit_code: int, rank_error: str, agreed_codes: Sequence[int]) -> bool:
    """True when mpiexec ended abnormally with no error reported by a rank."""
    return exit_code != 0 and exit_code not in agreed_codes and not rank_error


def recovery_failed(exit_code: int, rank_error: str) -> bool:
    """True when the ranks ended because the survivors of a death could not recover together
    (:data:`SHRINK_FAILED`): as after a runtime death, a relaunch is what is left."""
    return exit_code != 0 and SHRINK_FAILED in rank_error


def mpiexec_reason(lines: Sequence[str]) -> str:
    """What mpiexec said about its end, on one line: the first paragraph of the last boxed
    message (Open MPI frames its errors with rules of dashes), else its last line; "" when it
    said nothing."""
    text = [ln.strip() for ln in lines]

    def rule(ln: str) -> bool:
        return len(ln) >= 10 and set(ln) <= {"-", "="}

    rules = [i for i, ln in enumerate(text) if rule(ln)]
    if len(rules) >= 2:
        para: list[str] = []
        for ln in text[rules[-2] + 1:rules[-1]]:
            if ln:
                para.append(ln)
            elif para:
                break
        out = " ".join(para)
    else:
        rest = [ln for ln in text if ln and not rule(ln)]
        out = rest[-1] if rest else ""
    return out if len(out) <= 300 else out[:297] + "..."


def segment_log(log: str, attempt: int) -> str:
    """The run log of relaunch ``attempt`` (1, 2, …) beside the first one."""
    stem = log[:-3] if log.endswith(".h5") else log
    return f"{stem}.relaunch-{attempt}.h5"


def checkpoint_dir(log: str, configured: str) -> str:
    """Where the run writes its checkpoints (``runtime.failures.checkpoint_dir`` or beside the
    log, as :mod:`nereus.runtime.failures.recovery` decides)."""
    return configured or f"{log}.ckpt"


def runtime_kills(log: str) -> list[int]:
    """Ranks (original GPU ids) that recorded an injected death taking the runtime down."""
    try:
        with open(log + KILLS_SUFFIX, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    return sorted({int(ln.split()[0]) for ln in lines if ln.endswith(" runtime")})


def surviving_nodes(node_names: Sequence[str], gpus_per_node: int, log: str, *,
                    slurm_pool: Callable[[], Sequence[str]] | None, wait_s: float,
                    poll_s: float = 1.0) -> tuple[tuple[int, ...], str]:
    """(indices of the surviving virtual nodes, how they were found).

    ``slurm_pool`` returns the usable nodes of the allocation now (None without Slurm)."""
    n = len(node_names)
    if slurm_pool is None:
        dead = {r // gpus_per_node for r in runtime_kills(log)}
        return tuple(i for i in range(n) if i not in dead), "injected deaths (no scheduler)"
    deadline = time.monotonic() + wait_s
    while True:
        pool = set(slurm_pool())
        alive = tuple(i for i, name in enumerate(node_names) if name in pool)
        if len(alive) < n or time.monotonic() >= deadline:
            how = "Slurm" if len(alive) < n else f"Slurm reported no lost node in {wait_s:g} s"
            return alive, how
        time.sleep(poll_s)


def _renumber(items: Any, key: str, survivors: Sequence[int]) -> list[Any]:
    """Items whose ``key`` names a surviving node, renumbered; the others dropped."""
    index = {old: new for new, old in enumerate(survivors)}
    out = []
    for item in items or []:
        if isinstance(item, Mapping) and key in item:
            if item[key] not in index:
                continue
            item = {**item, key: index[item[key]]}
        out.append(item)
    return out


def survivor_config(raw: Mapping[str, Any], survivors: Sequence[int], resume_dir: str
                    ) -> dict[str, Any]:
    """The job config (as loaded from YAML) for a relaunch on ``survivors`` (virtual node
    indices of ``raw``'s cluster), resuming from ``resume_dir``'s newest checkpoint."""
    cfg = copy.deepcopy(dict(raw))
    cfg["cluster"] = {**cfg.get("cluster", {}), "nodes": len(survivors)}
    runtime = dict(cfg.get("runtime") or {})
    failures = dict(runtime.get("failures") or {})
    failures["resume"] = resume_dir
    failures["checkpoint_dir"] = resume_dir  # later checkpoints go on where these are
    failures["kill"] = _renumber(failures.get("kill"), "node", survivors)
    runtime["failures"] = failures
    events = []
    for ev in runtime.get("events") or []:
        node_key = next((k for k in ("remove_node", "add_node", "drain_node") if k in ev), None)
        if node_key is None:
            events.append(ev)
        else:
            events += _renumber([ev], node_key, survivors)
    if "events" in runtime:
        runtime["events"] = events
    runtime.pop("ranks", None)  # the survivors' GPUs
    late = int(runtime.get("late_nodes", 0) or 0)
    if late:
        n = int(raw.get("cluster", {}).get("nodes", 0))
        runtime["late_nodes"] = sum(1 for i in survivors if i >= n - late)
    cfg["runtime"] = runtime
    return cfg
