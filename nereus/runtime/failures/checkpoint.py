"""The global-state checkpoint of ``nereus run`` (``runtime.failures.checkpoint_every``).

Every model-stage's logical state as global arrays plus its counters, one ``step-<k>.npz`` per
checkpoint, written atomically. numpy only at import, so the launcher (:mod:`nereus.runtime.
relaunch`) can find the newest checkpoint without importing torch and Megatron (~7 s).
"""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from nereus.runtime.worker.state import Counters

CKPT_PREFIX = "step-"
CKPT_NAME = re.compile(r"step-(\d{8})\.npz")  # save_global's names
FIELDS = ("param", "exp_avg", "exp_avg_sq")  # the state of every tensor (worker.state.FIELDS)


def save_global(directory: str, step: int, globs: dict[str, dict[str, dict[str, Any]]],
                counters: dict[str, tuple[Counters, float]],
                history: dict[str, Any] | None = None,
                extra: dict[str, Any] | None = None) -> str:
    """Write the logical state before step ``step`` (every model-stage's global arrays and
    counters) as ``step-<k>.npz``; atomic (written aside, then renamed). Returns the path.
    ``history``: the run's record so far (JSON-able: the summary rows of the steps before
    ``step``, the transitions), which a run resumed from here continues (:func:`read_history`).
    ``extra``: more plain data for a resume (the metadata :mod:`nereus.runtime.failures.
    resume_check` reads): the job fingerprint, the run log, the plan the state was on, the
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


def latest_global(directory: str, expect: Any = None
                  ) -> tuple[str, int, dict[str, Any], dict[str, tuple[Counters, float]]] | None:
    """(path, step, globs, counters) of the newest usable checkpoint in ``directory`` (checked
    whole against ``expect``, a :class:`~nereus.runtime.failures.resume_check.Expected`; torn
    or foreign files are passed over), or None."""
    from nereus.runtime.failures.resume_check import (
        Expected,
        Unusable,
        candidates,
        check_checkpoint,
    )

    for step, path in candidates(directory):
        try:
            check_checkpoint(path, expect or Expected(), crc=False)
            globs, counters = load_global(path)
        except Unusable:
            continue
        return path, step, globs, counters
    return None


def load_global(path: str) -> tuple[dict[str, Any], dict[str, tuple[Counters, float]]]:
    """(globs, counters) of the checkpoint file ``path``, already checked whole
    (:func:`nereus.runtime.failures.resume_check.check_checkpoint`); a member that fails its
    CRC check while it is read raises :class:`~nereus.runtime.failures.resume_check.Unusable`."""
    from nereus.runtime.failures.resume_check import Unusable

    globs: dict[str, Any] = {}
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = _meta(z)
            for key in z.files:
                if key == "__meta__":
                    continue
                ms, f, t = key.split("/", 2)
                globs.setdefault(ms, {}).setdefault(f, {})[t] = z[key]
    except Exception as exc:  # zipfile's Bad CRC-32, a file cut short since it was checked
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise Unusable(f"is damaged ({first})") from None
    from nereus.runtime.worker.state import Counters  # torch and Megatron: only when loading

    counters = {ms: (Counters(**c), float(adam)) for ms, (c, adam) in meta["counters"].items()}
    return globs, counters


def read_history(path: str) -> dict[str, Any] | None:
    """The run's record a checkpoint file carries (see :func:`save_global`; None in files
    written without one)."""
    with np.load(path) as z:
        history = _meta(z).get("history")
    return dict(history) if isinstance(history, dict) else None


def _meta(z: Any) -> dict[str, Any]:
    """The JSON metadata (step, counters, history) of an open checkpoint file."""
    meta: dict[str, Any] = json.loads(bytes(z["__meta__"]).decode())
    return meta
