"""Calibration persisted as JSON: written atomically, read back with one-line errors.

A run (or a simulation) saves what it learned — efficiency per (hardware, op class), memory
factor per model-stage — so a later run or ``nereus plan --calibration FILE`` starts from it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

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


def load_calibration(path: str | os.PathLike[str]) -> Calibration:
    p = Path(path)
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
