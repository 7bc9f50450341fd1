"""The global-state checkpoint of ``nereus run`` (``runtime.failures.checkpoint_every``).

Every model-stage's logical state as global arrays plus its counters, one ``step-<k>.npz`` per
checkpoint, written atomically. numpy only at import, so the launcher (:mod:`nereus.runtime.
relaunch`) can find the newest checkpoint without importing torch and Megatron (~7 s).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from nereus.runtime.worker.state import Counters

CKPT_PREFIX = "step-"


def save_global(directory: str, step: int, globs: dict[str, dict[str, dict[str, Any]]],
                counters: dict[str, tuple[Counters, float]],
                history: dict[str, Any] | None = None,
                extra: dict[str, Any] | None = None) -> str:
    """Write the logical state before step ``step`` (every model-stage's global arrays and
    counters) as ``step-<k>.npz``; atomic (written aside, then renamed). Returns the path.
    ``history``: the run's record so far (JSON-able: the summary rows of the steps before
    ``step``, the transitions), which a run resumed from here continues (:func:`read_history`).
    ``extra``: more plain data for a resume (:func:`read_meta`): the plan the state was on, the
    controller with its calibration (see :mod:`nereus.runtime.failures.restart`)."""
    os.makedirs(directory, exist_ok=True)
    arrays = {f"{ms}/{f}/{t}": a for ms, g in globs.items() for f, d in g.items()
              for t, a in d.items()}
    meta: dict[str, Any] = {"step": step, "counters": {ms: [vars(c), adam]
                                                       for ms, (c, adam) in counters.items()}}
    if history is not None:
        meta["history"] = history
    meta.update(extra or {})
    arrays["__meta__"] = np.frombuffer(json.dumps(meta, default=float).encode(), dtype=np.uint8)
    path = os.path.join(directory, f"{CKPT_PREFIX}{step:08d}.npz")
    tmp = path + ".part.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return path


def latest_global(directory: str) -> tuple[str, int, dict[str, Any], dict[str, tuple[Counters,
                                                                                       float]]] | None:
    """(path, step, globs, counters) of the newest checkpoint in ``directory``, or None."""
    path = newest_path(directory)
    if path is None:
        return None
    with np.load(path) as z:
        meta = _meta(z)
        globs: dict[str, Any] = {}
        for key in z.files:
            if key == "__meta__":
                continue
            ms, f, t = key.split("/", 2)
            globs.setdefault(ms, {}).setdefault(f, {})[t] = z[key]
    from nereus.runtime.worker.state import Counters  # torch and Megatron: only when loading

    counters = {ms: (Counters(**c), float(adam)) for ms, (c, adam) in meta["counters"].items()}
    return path, int(meta["step"]), globs, counters


def newest_path(directory: str) -> str | None:
    """The newest complete checkpoint file in ``directory`` (None if there is none)."""
    if not directory or not os.path.isdir(directory):
        return None
    names = sorted(n for n in os.listdir(directory)
                   if n.startswith(CKPT_PREFIX) and n.endswith(".npz") and ".part" not in n)
    return os.path.join(directory, names[-1]) if names else None


def newest_step(directory: str) -> int | None:
    """The step of the newest complete checkpoint (None if there is none); reads its metadata
    only."""
    path = newest_path(directory)
    if path is None:
        return None
    with np.load(path) as z:
        return int(_meta(z)["step"])


def read_history(path: str) -> dict[str, Any] | None:
    """The run's record a checkpoint file carries (see :func:`save_global`; None in files
    written without one)."""
    with np.load(path) as z:
        history = _meta(z).get("history")
    return dict(history) if isinstance(history, dict) else None


def read_meta(path: str) -> dict[str, Any]:
    """The whole JSON metadata of a checkpoint file (step, counters, history, extra)."""
    with np.load(path) as z:
        return _meta(z)


def _meta(z: Any) -> dict[str, Any]:
    """The JSON metadata (step, counters, history) of an open checkpoint file."""
    meta: dict[str, Any] = json.loads(bytes(z["__meta__"]).decode())
    return meta
