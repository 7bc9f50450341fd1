"""Calibration persisted as JSON: written as a new file (never over one, never half-written),
read back with one-line errors.

A run (or a simulation) saves what it learned — efficiency per (hardware, op class), memory
factor per model-stage — so a later run or ``nereus plan --calibration FILE`` starts from it.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from nereus.config.files import parse_json, read_text
from nereus.cost.calibration import Calibration
from nereus.errors import ConfigError
from nereus.log.outputs import NewFile

FORMAT = "nereus-calibration"
# 1: efficiencies and memory factors, fixed costs only when any was learned; 2 (written now):
# the same with "fixed_costs" always present (the live calibration of run-log schema 2).
VERSION = 2
READ_VERSIONS = (1, 2)


def calibration_json(calib: Calibration) -> bytes:
    """The file's content for ``calib`` (version :data:`VERSION`)."""
    doc = {"format": FORMAT, "version": VERSION, "fixed_costs": {}, **calib.to_dict()}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode("utf-8")


def save_calibration(path: str | os.PathLike[str], calib: Calibration,
                     field: str = "--save-calibration") -> None:
    """Write ``calib`` to the new file ``path`` (:class:`~nereus.log.outputs.NewFile`: never
    over anything, never half-written)."""
    out = NewFile(os.fspath(path), field)
    out.write(calibration_json(calib))
    out.publish()


def _hdf5_file(path: str) -> bool:
    """Whether ``path`` is a regular file that starts like HDF5 (anything else — a FIFO, a
    device, a missing path — is left to the JSON reader's one-line refusal; never opened here)."""
    from nereus.log.reader import HDF5_SIGNATURE

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as fh:
            return fh.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE
    except OSError:
        return False


def load_calibration(path: str | os.PathLike[str]) -> Calibration:
    """A calibration file (JSON, :func:`save_calibration`) or a run log (HDF5: what the run had
    learned at its last step, :func:`calibration_from_log`)."""
    p = os.fspath(path)
    if _hdf5_file(p):
        from nereus.log.reader import LogFormatError, read_run_log

        try:
            return calibration_from_log(read_run_log(p))
        except LogFormatError as exc:
            raise ConfigError("--calibration", p, f"not a readable run log ({exc})") from None
    doc = parse_json(read_text(p, "--calibration", "calibration file", "MAX_CALIBRATION_BYTES"),
                     "--calibration", p)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError("--calibration", p, f'not a calibration file (needs "format": "{FORMAT}")')
    version = doc.get("version")
    if isinstance(version, bool) or version not in READ_VERSIONS:
        shown = "missing" if "version" not in doc else f"{version!r}"[:40]
        raise ConfigError("--calibration", p, f"calibration file version {shown}; this nereus "
                          f"reads versions {' and '.join(map(str, READ_VERSIONS))} (and writes "
                          f"{VERSION})")
    body = {k: v for k, v in doc.items() if k not in ("format", "version")}
    return Calibration.from_dict(body)


def calibration_from_log(log: Any) -> Calibration:
    """What a run had calibrated at its last step: the efficiencies and fixed costs it logged
    last for each hardware (``nereus.log.reader.RunLog``; an empty store when none)."""
    eff: dict[tuple[str, str], float] = {}
    e = log.tables["efficiencies"]
    for hw, op, v in zip(e["hardware"], e["op_class"], e["efficiency"], strict=True):
        eff[(str(hw), str(op))] = float(v)  # rows in step order: the last one wins
    fixed: dict[tuple[str, str], float] = {}
    f = log.tables["fixed_costs"]
    for hw, ev, v in zip(f["hardware"], f["event"], f["seconds"], strict=True):
        fixed[(str(hw), str(ev))] = float(v)
    return Calibration(tuple(sorted((h, o, v) for (h, o), v in eff.items())), (),
                       tuple(sorted((h, k, v) for (h, k), v in fixed.items())))
