"""Where things are, for tests and for the scripts they run by path."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
REPO = TESTS.parent
GOLDEN = SUPPORT / "golden"  # launcher golden files; NEREUS_UPDATE_GOLDEN=1 rewrites them
