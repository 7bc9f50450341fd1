"""Where a resumed ``nereus run`` starts: the newest checkpoint or restorable rank dump.

``nereus run CONFIG --resume [DIR]`` (and a requeued Slurm job, ``SLURM_RESTART_COUNT`` > 0)
starts from the newest state in the checkpoint directory: a global checkpoint
(``step-<k>.npz``: the periodic ones of ``runtime.failures.checkpoint_every`` and the one a
preemption writes at a step boundary) or the rank dumps of a preemption that abandoned its step
(:mod:`nereus.runtime.failures.dumps`), whichever holds the later step. What it restores:
parameters, Adam state and counters (the data position: sample order and RNG are derived from
the seed, the step and the minibatch position, :mod:`nereus.runtime.worker.state`), the plan the
state was on and the controller with its calibration (when saved), and the run's record so far.
:func:`restart_step` reads metadata only (no torch), for the launcher.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nereus.runtime.failures.checkpoint import newest_path, read_meta
from nereus.runtime.failures.dumps import load_dump, newest_dump


@dataclass
class RestartPoint:
    source: str  # the checkpoint file, or the dump folder
    step: int  # the next step to run
    globs: dict[str, Any]
    counters: dict[str, Any]
    plan: dict[str, Any] | None  # the plan the state was on (None: not saved)
    controller: dict[str, Any] | None  # RankZeroController.to_dict() (None: not saved)
    history: dict[str, Any] | None  # rows, transitions, transition_s of the steps before

    def event(self) -> dict[str, Any]:
        return {"from_checkpoint": self.source, "step": self.step}


def restart_step(directory: str) -> int | None:
    """The step the newest restorable state in ``directory`` starts at (None: nothing)."""
    path = newest_path(directory)
    step = None if path is None else int(read_meta(path)["step"])
    dump = newest_dump(directory)
    if dump is not None and (step is None or dump.step > step):
        return dump.step
    return step


def load_restart(directory: str, setup: Any) -> RestartPoint | None:
    """The newest restorable state in ``directory`` as global arrays on ``setup``'s models."""
    from nereus.runtime.failures.checkpoint import latest_global
    from nereus.runtime.worker.state import Counters
    from nereus.runtime.worker.units import assemble_global, spec_of

    path = newest_path(directory)
    step = None if path is None else int(read_meta(path)["step"])
    dump = newest_dump(directory)
    if dump is not None and (step is None or dump.step > step):
        pieces, raw = load_dump(dump)
        globs = {name: assemble_global(spec_of(setup, name), pcs) for name, pcs in pieces.items()}
        counters = {name: (Counters(**c), adam) for name, (c, adam) in raw.items()}
        history = dump.extra.get("history")
        if isinstance(history, dict):
            history = {**history, "rows": [r for r in history["rows"] if r["step"] < dump.step]}
        return RestartPoint(f"{directory}/dump-{dump.segment} (step {dump.step})", dump.step,
                            globs, counters, dump.plan, dump.extra.get("controller"),
                            history if isinstance(history, dict) else None)
    ck = latest_global(directory)
    if ck is None:
        return None
    meta = read_meta(ck[0])
    return RestartPoint(ck[0], ck[1], ck[2], ck[3], meta.get("plan"), meta.get("controller"),
                        meta.get("history"))
