"""The one error hierarchy of Nereus.

Every error a user can cause names the field, the value and the rule it broke, so that the CLI can
print it as a single line and exit with status 2.
"""

from __future__ import annotations

import reprlib
from typing import Any

# How much of a bad value an error line shows: a value that came from a hostile input (a huge
# list, a long string, an integer of thousands of digits) must not make the line itself huge.
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = 300
_SHOWN.maxother = 300
_SHOWN.maxlong = 60
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 8
_SHOWN.maxlevel = 3


def shown(value: Any) -> str:
    """``repr(value)``, shortened to at most a few hundred characters (never raises)."""
    try:
        return _SHOWN.repr(value)
    except Exception:  # e.g. an int too long for str(); a repr that fails
        return f"<{type(value).__name__}>"


class NereusError(Exception):
    """Root of every error Nereus raises on purpose."""


class ConfigError(NereusError):
    """A configuration value (YAML field, CLI flag, trace entry) breaks a rule."""

    def __init__(self, field: str, value: Any, rule: str) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        super().__init__(f"{field}={shown(value)}: {rule}")


class InfeasiblePlanError(NereusError):
    """No execution plan satisfies the memory and GPU-budget constraints."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class TransitionError(NereusError):
    """A transition between two plans cannot be compiled or executed."""


class CommunicationError(NereusError):
    """A collective or point-to-point transfer failed or timed out (e.g. a peer rank died)."""


class LogFormatError(NereusError):
    """An HDF5 log (or another file we read) is truncated, foreign or of an unknown version."""

    def __init__(self, path: str, rule: str) -> None:
        self.path = path
        self.rule = rule
        super().__init__(f"{path}: {rule}")
