"""Calibration persisted as JSON: written as a new file (never over one, never half-written),
read back with one-line errors.

A run (or a simulation) saves what it learned — efficiency per (hardware, op class), memory
factor per model-stage — so a later run or ``nereus plan --calibration FILE`` starts from it.
"""

from __future__ import annotations

import json
import os

from nereus.config.files import parse_json, read_text
from nereus.cost.calibration import Calibration
from nereus.errors import ConfigError
from nereus.log.outputs import NewFile

FORMAT = "nereus-calibration"
VERSION = 1


def calibration_json(calib: Calibration) -> bytes:
    """The file's content for ``calib``."""
    doc = {"format": FORMAT, "version": VERSION, **calib.to_dict()}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode("utf-8")


def save_calibration(path: str | os.PathLike[str], calib: Calibration,
                     field: str = "--save-calibration") -> None:
    """Write ``calib`` to the new file ``path`` (:class:`~nereus.log.outputs.NewFile`: never
    over anything, never half-written)."""
    out = NewFile(os.fspath(path), field)
    out.write(calibration_json(calib))
    out.publish()


def load_calibration(path: str | os.PathLike[str]) -> Calibration:
    p = os.fspath(path)
    doc = parse_json(read_text(p, "--calibration", "calibration file", "MAX_CALIBRATION_BYTES"),
                     "--calibration", p)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError("--calibration", p, f'not a calibration file (needs "format": "{FORMAT}")')
    if doc.get("version") != VERSION:
        raise ConfigError("--calibration", doc.get("version"), f"calibration file version must be {VERSION}")
    body = {k: v for k, v in doc.items() if k not in ("format", "version")}
    return Calibration.from_dict(body)
