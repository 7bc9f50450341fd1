"""Calibration persisted as JSON: written atomically, read back with one-line errors.

A run (or a simulation) saves what it learned — efficiency per (hardware, op class), memory
factor per model-stage — so a later run or ``nereus plan --calibration FILE`` starts from it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from nereus.cost.calibration import Calibration
from nereus.errors import ConfigError

FORMAT = "nereus-calibration"
VERSION = 1


def save_calibration(path: str | os.PathLike[str], calib: Calibration) -> None:
    """Write ``calib`` to ``path`` via a temporary file and a rename: never half-written."""
    p = Path(path)
    doc = {"format": FORMAT, "version": VERSION, **calib.to_dict()}
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=str(p.parent or "."))
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def load_calibration(path: str | os.PathLike[str]) -> Calibration:
    """A calibration file (JSON, :func:`save_calibration`) or a run log (HDF5: what the run had
    learned at its last step, :func:`calibration_from_log`)."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            head = fh.read(len(HDF5_SIGNATURE))
    except OSError:
        head = b""
    if head == HDF5_SIGNATURE:
        from nereus.log.reader import LogFormatError, read_run_log

        try:
            return calibration_from_log(read_run_log(p))
        except LogFormatError as exc:
            raise ConfigError("--calibration", str(p), f"not a readable run log ({exc})") from None
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("--calibration", str(p), f"must be a readable JSON file ({exc.__class__.__name__})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("--calibration", str(p), f"not valid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError("--calibration", str(p), f'not a calibration file (needs "format": "{FORMAT}")')
    if doc.get("version") != VERSION:
        raise ConfigError("--calibration", doc.get("version"), f"calibration file version must be {VERSION}")
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
