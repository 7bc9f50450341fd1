"""Where a resumed ``nereus run`` starts: the newest checkpoint or restorable rank dump.

``nereus run CONFIG --resume [DIR]`` (and a requeued Slurm job, ``SLURM_RESTART_COUNT`` > 0)
starts from the newest usable state in the checkpoint directory (every file checked whole
against the job first, torn or foreign ones passed over: :mod:`nereus.runtime.failures.
resume_check`): a global checkpoint
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

from nereus.errors import ConfigError
from nereus.runtime.failures.dumps import load_dump
from nereus.runtime.failures.resume_check import Expected, Selection, Unusable, select


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
    """The step the newest readable state in ``directory`` starts at (None: nothing); its
    files' structure only (no job to compare with), for the launcher's own messages."""
    choice = select(directory, Expected(), crc=False).choice
    return None if choice is None else choice.step


def load_restart(directory: str, setup: Any, expect: Expected,
                 field: str = "--resume") -> RestartPoint:
    """The newest usable state in ``directory`` (:func:`nereus.runtime.failures.resume_check.
    select`, against ``expect``) as global arrays on ``setup``'s models; a ``ConfigError``
    naming ``field`` when there is none (the launcher checked the same before any rank started:
    this is the ranks' own check, in case a file changed since)."""
    from nereus.runtime.failures.checkpoint import load_global
    from nereus.runtime.worker.state import Counters
    from nereus.runtime.worker.units import assemble_global, spec_of

    sel: Selection = select(directory, expect, crc=False)
    ch = sel.choice
    if ch is None:
        raise ConfigError(field, directory, sel.refusal(field, directory))
    try:
        if ch.dump is not None:
            dump = ch.dump
            pieces, raw = load_dump(dump)
            globs = {name: assemble_global(spec_of(setup, name), pcs)
                     for name, pcs in pieces.items()}
            counters = {name: (Counters(**c), adam) for name, (c, adam) in raw.items()}
            history = dump.extra.get("history")
            if isinstance(history, dict):
                history = {**history, "rows": [r for r in history["rows"]
                                               if r["step"] < dump.step]}
            return RestartPoint(f"{directory}/dump-{dump.segment} (step {dump.step})",
                                dump.step, globs, counters, dump.plan,
                                dump.extra.get("controller"),
                                history if isinstance(history, dict) else None)
        globs, counters = load_global(ch.source)
    except Unusable as exc:
        raise ConfigError(field, directory, f"{ch.source} {exc}; move it aside or {field} "
                          "another folder") from None
    except Exception as exc:  # a dump member that fails its CRC check while it is read
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise ConfigError(field, directory, f"{ch.source} is damaged ({first}); move it "
                          f"aside or {field} another folder") from None
    meta = ch.meta or {}
    return RestartPoint(ch.source, ch.step, globs, counters, meta.get("plan"),
                        meta.get("controller"), meta.get("history"))


def restored_controller(ctl: Any, point: RestartPoint, setup: Any
                        ) -> tuple[Any, dict[str, Any] | None]:
    """Rank 0 of a resumed run: the controller as it was saved (calibration, controller state,
    pinned layouts) and its plan when the allocation is the one it ran on; on another
    allocation the calibration only, and no plan (a replan on the ranks there are now)."""
    from nereus.runtime.rank0.controller import RankZeroController

    if point.controller is None:
        return ctl, None
    saved = RankZeroController.from_dict(setup, point.controller)
    same = point.plan is not None and saved.pool == ctl.pool and all(
        g < setup.cluster.num_gpus for sp in point.plan["stages"] for r in sp["replicas"]
        for g in r)
    if same:
        return saved, point.plan
    ctl.calib = saved.calib
    return ctl, None
