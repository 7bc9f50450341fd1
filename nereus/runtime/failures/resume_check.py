"""What a resumed ``nereus run`` may start from, checked whole before anything is written.

A resumed run (``--resume``, a requeued Slurm job, ``runtime.failures.resume``) starts from the
newest *usable* state in a checkpoint directory: a global checkpoint ``step-<k>.npz``
(:mod:`nereus.runtime.failures.checkpoint`) or a boundary of the rank dumps a preemption left
(``dump-<segment>/rank-<r>.npz``, :mod:`nereus.runtime.failures.dumps`). A file is usable when
it is a regular file and a complete ``.npz`` archive (every member passes its CRC check, when
asked: the launcher asks), holds arrays only (no pickled objects), has its metadata present and
typed, was written for this job (its fingerprint, :mod:`nereus.config.fingerprint`, equals the
config's), holds every array of the job's state with the shapes of the config's models, and
belongs to the run log being continued (the log itself or one of its relaunch segments).

:func:`select` goes from the newest candidate to older ones and takes the first usable one; the
unusable files it passed are named (a warning when an older state was taken, the error when none
was). numpy only (no torch): the launcher checks before any rank starts, and every rank checks
again before it loads.
"""

from __future__ import annotations

import json
import os
import re
import stat
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nereus.config.files import kind_of
from nereus.config.fingerprint import Fingerprint
from nereus.runtime.failures.checkpoint import CKPT_NAME, FIELDS
from nereus.runtime.failures.dumps import DUMP_PREFIX, RANK_NAME, DumpedBoundary, boundaries_of

COUNTER_KEYS = ("updates", "model_stage_version", "policy_version", "position")
_SEGMENT = re.compile(r"\.relaunch-\d+\.h5$")  # nereus.runtime.failures.relaunch.segment_log


class Unusable(Exception):
    """One file cannot be resumed from; the message says why (a fragment: "is cut short …")."""


@dataclass(frozen=True)
class Expected:
    """What a usable file must match. ``fingerprint``: the job's (None: not compared);
    ``shapes``: model-stage → tensor → global shape ({}: not compared); ``log``: the run log
    the state must belong to (absolute; "": any); ``setup``: the job's Setup (for the saved
    controller; None: not loaded)."""

    fingerprint: Fingerprint | None = None
    shapes: Mapping[str, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)
    log: str = ""
    setup: Any = None


def expected_for(setup: Any, fingerprint: Fingerprint | None, log: str = "") -> Expected:
    """The expectation of the job ``setup`` (a ``Setup``) with ``fingerprint``."""
    from nereus.emu.shards import tensor_specs

    job = setup.job
    shapes = {ms.name: {t.name: tuple(t.global_shape)
                        for t in tensor_specs(job.model(ms.role))}
              for ms in job.workflow.model_stages}
    return Expected(fingerprint, shapes, os.path.abspath(log) if log else "", setup)


def belongs_to(recorded: str, log: str) -> bool:
    """Whether state written for the run log ``recorded`` continues ``log``: the same file, or
    one of the segments a relaunch wrote beside it (``<log stem>.relaunch-<n>.h5``)."""
    if not recorded:
        return False
    a, b = os.path.abspath(recorded), os.path.abspath(log)
    stem = b[:-3] if b.endswith(".h5") else b
    return a == b or (a.startswith(stem) and _SEGMENT.fullmatch(a[len(stem):]) is not None)


# ---- one archive -------------------------------------------------------------------------

def _regular(path: str) -> None:
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            info = os.stat(path)
    except FileNotFoundError:
        raise Unusable("is a dangling symlink") from None
    except OSError as exc:
        raise Unusable(f"cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise Unusable(f"is {kind_of(info.st_mode)}, not a checkpoint file")
    if info.st_size == 0:
        raise Unusable("is empty (0 bytes)")


def read_archive(path: str, crc: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, array key → (dtype, shape)) of the ``.npz`` file ``path``, reading headers
    only (``crc``: every member's bytes are read once for its CRC check). Raises
    :class:`Unusable`."""
    _regular(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(6)
    except OSError as exc:
        raise Unusable(f"cannot be read ({exc.strerror or exc})") from None
    if head == b"\x93NUMPY":
        raise Unusable("is a single .npy array, not a checkpoint archive (.npz)")
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise Unusable("is not a complete .npz archive (cut short, damaged, or another kind "
                       "of file)") from None
    with zf:
        try:
            if crc:
                bad = zf.testzip()
                if bad is not None:
                    raise Unusable(f"is damaged: its member {bad} fails its CRC check")
            members: dict[str, Any] = {}
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    raise Unusable(f"holds {info.filename!r}, which is not an array")
                with zf.open(info) as fp:
                    major, _ = np.lib.format.read_magic(fp)
                    read = (np.lib.format.read_array_header_1_0 if major == 1
                            else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read(fp)
                key = info.filename[:-4]
                if dtype.hasobject:
                    raise Unusable(f"holds pickled Python objects in its array {key!r} (a "
                                   "checkpoint holds numbers only; it is never unpickled)")
                members[key] = (dtype, tuple(int(n) for n in shape))
            if "__meta__" not in members:
                raise Unusable("has no metadata (__meta__): not written by nereus run")
            with zf.open("__meta__.npy") as fp:
                raw = np.lib.format.read_array(fp, allow_pickle=False)
        except Unusable:
            raise
        except Exception as exc:  # zipfile, zlib, numpy header errors: a torn or foreign file
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
            raise Unusable(f"is damaged or not a checkpoint ({first})") from None
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise Unusable("has metadata (__meta__) that is not JSON bytes")
    try:
        meta = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Unusable("has metadata (__meta__) that is not valid JSON") from None
    if not isinstance(meta, dict):
        raise Unusable("has metadata (__meta__) that is not a JSON object")
    del members["__meta__"]
    return meta, members


# ---- typed metadata ----------------------------------------------------------------------

def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Unusable(f"has {what}={str(value)[:40]!r} in its metadata, not a count (an "
                       "integer ≥ 0)")
    return value


def _counters(value: Any, what: str) -> None:
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], dict)
            and sorted(value[0]) == sorted(COUNTER_KEYS)
            and isinstance(value[1], (int, float)) and not isinstance(value[1], bool)):
        raise Unusable(f"has {what} that is not [counters, Adam step]")
    for k in COUNTER_KEYS:
        _count(value[0][k], f"{what}.{k}")


def _history(value: Any) -> None:
    if value is None:
        return
    if not (isinstance(value, dict) and isinstance(value.get("rows"), list)
            and all(isinstance(r, dict) for r in value["rows"])
            and isinstance(value.get("transition_s", 0.0), (int, float))):
        raise Unusable("has a history that is not the run's record")
    _count(value.get("transitions", 0), "history.transitions")
    for r in value["rows"]:
        _count(r.get("step"), "history.rows[].step")


def _plan(value: Any, what: str) -> None:
    from nereus.spec.plan import ExecutionPlan

    if value is None:
        return
    try:
        plan = ExecutionPlan.from_dict(value)
        assert all(r for sp in plan.stages for r in sp.replicas)
    except Exception:
        raise Unusable(f"has a {what} that is not an execution plan") from None


def _controller(value: Any, setup: Any) -> None:
    if value is None or setup is None:
        return
    from nereus.runtime.rank0.controller import RankZeroController

    try:
        RankZeroController.from_dict(setup, value)
    except Exception:
        raise Unusable("has a saved controller this job cannot read") from None


def _job(meta: Mapping[str, Any], expect: Expected) -> None:
    """The fingerprint and the run log a file records, against ``expect``."""
    if expect.fingerprint is not None:
        if "fingerprint" not in meta:
            raise Unusable("records no job fingerprint (written by an older nereus)")
        fp = Fingerprint.from_dict(meta["fingerprint"])
        if fp is None:
            raise Unusable("has a malformed job fingerprint (edited, or damaged)")
        if fp != expect.fingerprint:
            raise Unusable(f"was written by another job ({expect.fingerprint.differences(fp)})")
    if expect.log:
        log = meta.get("log")
        if not isinstance(log, str) or not belongs_to(log, expect.log):
            shown = log if isinstance(log, str) and log else "no run log"
            raise Unusable(f"belongs to the run log {shown}, not {expect.log}")


def _state_shapes(members: Mapping[str, Any], expect: Expected) -> None:
    """A checkpoint's arrays: every (model-stage, field, tensor) of the job, at its shape."""
    if not expect.shapes:
        return
    seen = set()
    for key, (dtype, shape) in members.items():
        parts = key.split("/", 2)
        if len(parts) != 3:
            raise Unusable(f"holds array {key!r}, not named <model-stage>/<field>/<tensor>")
        ms, f, t = parts
        want = expect.shapes.get(ms, {}).get(t)
        if want is None or f not in FIELDS:
            raise Unusable(f"holds {key}, which is not part of this job's state")
        if shape != want:
            raise Unusable(f"has {key} of shape {list(shape)}; the config's model has "
                           f"{list(want)}")
        if dtype.kind != "f":
            raise Unusable(f"has {key} of dtype {dtype}, not floating point")
        seen.add((ms, f, t))
    missing = [f"{ms}/{f}/{t}" for ms, tensors in expect.shapes.items() for f in FIELDS
               for t in tensors if (ms, f, t) not in seen]
    if missing:
        raise Unusable(f"lacks {len(missing)} arrays of the job's state (first: {missing[0]})")


def check_checkpoint(path: str, expect: Expected, crc: bool = True) -> dict[str, Any]:
    """The metadata of the global checkpoint ``path`` if it is usable; else :class:`Unusable`."""
    meta, members = read_archive(path, crc)
    step = _count(meta.get("step"), "step")
    m = CKPT_NAME.fullmatch(os.path.basename(path))
    if m is not None and int(m.group(1)) != step:
        raise Unusable(f"is named for step {int(m.group(1))} but holds step {step}")
    counters = meta.get("counters")
    if not isinstance(counters, dict):
        raise Unusable("has no counters in its metadata")
    for name, value in counters.items():
        _counters(value, f"counters.{name}")
    if expect.shapes and set(counters) != set(expect.shapes):
        raise Unusable(f"has counters of {sorted(counters)}, but the job's model-stages are "
                       f"{sorted(expect.shapes)}")
    _history(meta.get("history"))
    _plan(meta.get("plan"), "plan")
    _job(meta, expect)
    _state_shapes(members, expect)
    _controller(meta.get("controller"), expect.setup)
    return meta


def check_dump_file(path: str, expect: Expected, crc: bool = True) -> dict[str, Any]:
    """The metadata of one rank's dump ``path`` if it is usable; else :class:`Unusable`."""
    meta, members = read_archive(path, crc)
    m = RANK_NAME.fullmatch(os.path.basename(path))
    rank = _count(meta.get("rank"), "rank")
    if m is not None and int(m.group(1)) != rank:
        raise Unusable(f"is named for rank {int(m.group(1))} but holds rank {rank}")
    bounds = meta.get("boundaries")
    if not isinstance(bounds, list) or not isinstance(meta.get("extra", {}), dict):
        raise Unusable("has no boundaries in its metadata")
    for i, b in enumerate(bounds):
        if not isinstance(b, dict) or not isinstance(b.get("held"), dict):
            raise Unusable(f"has boundaries[{i}] that is not a boundary")
        _count(b.get("step"), f"boundaries[{i}].step")
        _count(b.get("version"), f"boundaries[{i}].version")
        _plan(b.get("plan"), f"boundaries[{i}].plan")
        for name, by_dp in b["held"].items():
            if not isinstance(by_dp, dict):
                raise Unusable(f"has a malformed boundaries[{i}].held.{name}")
            for entry in by_dp.values():
                _dump_entry(entry, name, members, expect, f"boundaries[{i}].held.{name}")
    extra = meta.get("extra") or {}
    _history(extra.get("history"))
    _job(meta, expect)
    _controller(extra.get("controller"), expect.setup)
    return meta


def _dump_entry(entry: Any, name: str, members: Mapping[str, Any], expect: Expected,
                what: str) -> None:
    if not isinstance(entry, dict) or not isinstance(entry.get("pieces"), list):
        raise Unusable(f"has a malformed {what}")
    if entry.get("counters") is not None:
        _counters(entry["counters"], f"{what}.counters")
    for piece in entry["pieces"]:
        if not (isinstance(piece, list) and len(piece) == 5 and piece[4] in members
                and all(isinstance(x, list) for x in piece[2:4])):
            raise Unusable(f"names a piece in {what} that it does not hold")
        f, tensor, start, stop, key = piece
        shape = members[key][1]
        if [b - a for a, b in zip(start, stop, strict=False)] != list(shape):
            raise Unusable(f"has piece {key} of shape {list(shape)}, not its range's")
        want = expect.shapes.get(name, {}).get(tensor) if expect.shapes else None
        if expect.shapes and (want is None or f not in FIELDS or len(start) != len(want)
                              or any(not 0 <= a < b <= n
                                     for a, b, n in zip(start, stop, want, strict=True))):
            raise Unusable(f"has piece {key} ({name} {f} {tensor} {start}:{stop}), which does "
                           "not fit the config's model")


# ---- the choice in a directory -----------------------------------------------------------

@dataclass(frozen=True)
class Choice:
    """The state a resumed run starts from: ``step`` (the next step to run), ``source`` (the
    checkpoint file or the dump folder), a checkpoint's metadata or a dump's boundary, and the
    run log it belongs to ("" when it names none)."""

    step: int
    source: str
    meta: dict[str, Any] | None = None
    dump: DumpedBoundary | None = None
    log: str = ""


@dataclass(frozen=True)
class Selection:
    """:func:`select`'s answer: the choice (None: nothing usable) and the unusable files it
    passed on the way, as (path, why)."""

    choice: Choice | None
    skipped: tuple[tuple[str, str], ...] = ()

    def warnings(self) -> list[str]:
        return [f"nereus: warning: skipped {p}: it {why} (move it aside to silence this)"
                for p, why in self.skipped]

    def refusal(self, field: str, directory: str) -> str:
        """The rule of the one-line error when nothing was usable."""
        if not self.skipped:
            return "holds no checkpoint to resume from"
        path, why = self.skipped[0]
        more = f" (and {len(self.skipped) - 1} more unusable file(s))" \
            if len(self.skipped) > 1 else ""
        return (f"holds no usable checkpoint: {path} {why}{more}; move it aside (if an older "
                f"checkpoint is there, the run resumes from it) or {field} another folder")


def candidates(directory: str) -> list[tuple[int, str]]:
    """(step, path) of the global checkpoint files in ``directory``, newest first (the step
    their name says; anything named ``step-<8 digits>.npz``, whatever it is, counts)."""
    if not directory or not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        m = CKPT_NAME.fullmatch(name)
        if m is not None:
            found.append((int(m.group(1)), os.path.join(directory, name)))
    return sorted(found, reverse=True)


def _dumps(directory: str, expect: Expected, crc: bool
           ) -> tuple[list[DumpedBoundary], list[tuple[str, str]]]:
    """The restorable dump boundaries in ``directory`` and the unusable rank files."""
    found: list[DumpedBoundary] = []
    bad: list[tuple[str, str]] = []
    if not directory or not os.path.isdir(directory):
        return found, bad
    for sub in sorted(os.listdir(directory)):
        folder = os.path.join(directory, sub)
        if not sub.startswith(DUMP_PREFIX) or not os.path.isdir(folder):
            continue
        metas: dict[str, dict[str, Any]] = {}
        for name in sorted(os.listdir(folder)):
            if RANK_NAME.fullmatch(name) is None:
                continue
            path = os.path.join(folder, name)
            try:
                metas[path] = check_dump_file(path, expect, crc)
            except Unusable as exc:
                bad.append((path, str(exc)))
        found += boundaries_of(sub[len(DUMP_PREFIX):], metas)
    return found, bad


def select(directory: str, expect: Expected, crc: bool = True) -> Selection:
    """The newest usable state in ``directory`` (a dump boundary only when it is newer than
    the newest usable checkpoint) and the unusable files newer than it."""
    dumps, bad_dumps = _dumps(directory, expect, crc)
    skipped: list[tuple[str, str]] = []
    best: Choice | None = None
    for step, path in candidates(directory):
        try:
            meta = check_checkpoint(path, expect, crc)
        except Unusable as exc:
            skipped.append((path, str(exc)))
            continue
        log = meta.get("log")
        best = Choice(step, path, meta=meta, log=log if isinstance(log, str) else "")
        break
    newest = dumps[-1] if dumps else None
    if newest is not None and (best is None or newest.step > best.step):
        best = Choice(newest.step, os.path.dirname(newest.files[0]), dump=newest,
                      log=newest.log)
        skipped = [(p, why) for p, why in skipped if _step_of(p) > newest.step]
    skipped += bad_dumps
    return Selection(best, tuple(skipped))


def _step_of(path: str) -> int:
    m = CKPT_NAME.fullmatch(os.path.basename(path))
    return int(m.group(1)) if m else -1


def run_fingerprint(cfg: Any, rc: Any) -> Fingerprint:
    """The fingerprint of ``nereus run``'s job: the config ``cfg`` run with ``rc.seed`` on the
    built-in task's prompts."""
    from nereus.config.fingerprint import job_fingerprint
    from nereus.rl.task import task_identity

    return job_fingerprint(cfg, rc.seed, task_identity(rc.seed))
