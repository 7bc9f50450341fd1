"""The one error hierarchy of Nereus.

Every error a user can cause names the field, the value and the rule it broke, so that the CLI can
print it as a single line and exit with status 2.
"""

from __future__ import annotations

from typing import Any


class NereusError(Exception):
    """Root of every error Nereus raises on purpose."""


class ConfigError(NereusError):
    """A configuration value (YAML field, CLI flag, trace entry) breaks a rule."""

    def __init__(self, field: str, value: Any, rule: str) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        super().__init__(f"{field}={value!r}: {rule}")


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
