"""Per-rank dumps of the last safe boundaries, written when a preempted rank abandons its step.

A rank that cannot reach the next step boundary before the scheduler's deadline
(:mod:`nereus.runtime.failures.preemption`) writes, without any collective, its own shards of
the last two boundaries it kept (:class:`nereus.runtime.failures.boundary.BoundaryBook`) to
``<checkpoint dir>/dump-<segment>/rank-<r>.npz`` (atomic: written aside, then renamed). Rank 0
adds the controller and the run's record. A boundary can be restored when every model-stage has
one DP replica all of whose ranks wrote it (:func:`boundaries_of`; the files are checked whole
first, :mod:`nereus.runtime.failures.resume_check`). numpy only at import, like
:mod:`nereus.runtime.failures.checkpoint`: the launcher reads the dumps' steps without torch.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DUMP_PREFIX = "dump-"
RANK_NAME = re.compile(r"rank-(\d+)\.npz")  # a rank's file in a dump folder


@dataclass(frozen=True)
class DumpedBoundary:
    """A boundary restorable from rank dumps: its step, plan version, plan (as a dict), the
    files that hold it and what rank 0 added (controller, record), if rank 0 wrote it."""

    step: int
    version: int
    segment: str
    plan: dict[str, Any]
    files: tuple[str, ...]
    extra: dict[str, Any]
    log: str = ""  # the run log the ranks wrote (a file written before logs were named: "")


def write_rank_dump(directory: str, segment: str, rank: int, boundaries: Sequence[Any],
                    extra: dict[str, Any] | None = None, reason: str = "",
                    job: dict[str, Any] | None = None) -> str:
    """This rank's shards of ``boundaries`` (:class:`~nereus.runtime.failures.boundary.Boundary`
    records) as one file; ``extra``: plain data rank 0 adds (controller, record); ``job``: what
    every rank records of the job (its ``fingerprint`` and run ``log``)."""
    folder = os.path.join(directory, f"{DUMP_PREFIX}{segment}")
    os.makedirs(folder, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    metas = []
    for i, b in enumerate(boundaries):
        held: dict[str, Any] = {}
        for name, by_dp in b.held.items():
            held[name] = {}
            for dp_rank, (pieces, counters) in by_dp.items():
                rows = []
                for j, (f, tensor, start, stop, arr) in enumerate(pieces):
                    key = f"b{i}/{name}/{dp_rank}/{j}"
                    arrays[key] = np.asarray(arr)
                    rows.append([f, tensor, list(start), list(stop), key])
                held[name][str(dp_rank)] = {
                    "pieces": rows,
                    "counters": None if counters is None else [vars(counters[0]),
                                                               float(counters[1])]}
        metas.append({"step": int(b.step), "version": int(b.version),
                      "plan": b.plan.to_dict(), "held": held})
    meta = {"rank": rank, "segment": segment, "boundaries": metas, "reason": reason,
            "extra": extra or {}, **(job or {})}
    arrays["__meta__"] = np.frombuffer(json.dumps(meta, default=float).encode(), dtype=np.uint8)
    path = os.path.join(folder, f"rank-{rank}.npz")
    tmp = path + ".part.npz"
    np.savez(tmp, **arrays)  # type: ignore[arg-type]
    os.replace(tmp, path)
    return path


def _complete(plan: dict[str, Any], ranks: set[int]) -> bool:
    """Whether every model-stage of ``plan`` has a replica all of whose ranks are ``ranks``."""
    return all(any(set(int(g) for g in rep) <= ranks for rep in sp["replicas"])
               for sp in plan["stages"])


def boundaries_of(segment: str, metas: dict[str, dict[str, Any]]) -> list[DumpedBoundary]:
    """Every boundary the rank files of one dump folder can restore, oldest first (``metas``:
    path → metadata of the files already checked whole, :func:`nereus.runtime.failures.
    resume_check.check_dump_file`)."""
    by_key: dict[tuple[int, int], dict[str, Any]] = {}
    for path, meta in metas.items():
        for b in meta["boundaries"]:
            entry = by_key.setdefault((int(b["step"]), int(b["version"])),
                                      {"plan": b["plan"], "ranks": {}, "extra": {}, "log": ""})
            entry["ranks"][int(meta["rank"])] = path
            if meta.get("extra"):
                entry["extra"] = meta["extra"]
            if isinstance(meta.get("log"), str):
                entry["log"] = meta["log"]
    found = [DumpedBoundary(step, version, segment, e["plan"],
                            tuple(e["ranks"][r] for r in sorted(e["ranks"])), e["extra"],
                            e["log"])
             for (step, version), e in sorted(by_key.items())
             if _complete(e["plan"], set(e["ranks"]))]
    found.sort(key=lambda d: (d.step, d.version))
    return found


def load_dump(d: DumpedBoundary) -> tuple[dict[str, list[Any]], dict[str, tuple[dict[str, Any],
                                                                              float]]]:
    """(pieces per model-stage of one complete replica, counters per model-stage as
    ``(fields, adam step)``) of boundary ``d``; assemble with
    :func:`nereus.runtime.worker.units.assemble_global`."""
    ranks: dict[int, str] = {}
    for path in d.files:  # checked whole: named for the rank it holds
        m = RANK_NAME.fullmatch(os.path.basename(path))
        if m is not None:
            ranks[int(m.group(1))] = path
    pieces: dict[str, list[Any]] = {}
    counters: dict[str, tuple[dict[str, Any], float]] = {}
    for sp in d.plan["stages"]:
        name = sp["name"]
        dp = next(i for i, rep in enumerate(sp["replicas"])
                  if set(int(g) for g in rep) <= set(ranks))
        for g in sorted({int(g) for g in sp["replicas"][dp]}):
            with np.load(ranks[g]) as z:
                meta = json.loads(bytes(z["__meta__"]).decode())
                b = next(b for b in meta["boundaries"]
                         if (int(b["step"]), int(b["version"])) == (d.step, d.version))
                entry = b["held"].get(name, {}).get(str(dp))
                if entry is None:
                    continue
                for f, tensor, start, stop, key in entry["pieces"]:
                    pieces.setdefault(name, []).append((f, tensor, tuple(start), tuple(stop),
                                                        z[key]))
                if entry["counters"] is not None:
                    fields, adam = entry["counters"]
                    counters[name] = (dict(fields), float(adam))
    return pieces, counters
