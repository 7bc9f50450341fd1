"""Typed checks of raw YAML values (and command-line flags) at a dotted field path; every failure
is a ``ConfigError``.

Numbers are bounded: NaN and infinities are refused, and so is a value above its limit
(:mod:`nereus.config.limits`, named by ``limit``; ``MAX_INT`` / ``MAX_NUMBER`` unless a field
names a tighter one), so that a huge value is refused here rather than overflowing later.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from typing import Any

from nereus.config import limits
from nereus.errors import ConfigError


def join(path: str, key: str) -> str:
    """``join("cluster", "nodes")`` → ``cluster.nodes``; an empty ``path`` gives ``key``."""
    return f"{path}.{key}" if path else key


def mapping(path: str, value: Any, allowed: Iterable[str]) -> Mapping[str, Any]:
    """``value`` as a mapping whose keys are strings among ``allowed``."""
    names = tuple(allowed)
    if not isinstance(value, Mapping):
        raise ConfigError(path, value, f"must be a mapping with keys {', '.join(names)}")
    for key in value:
        if not isinstance(key, str):
            raise ConfigError(join(path, str(key)), value[key], "keys must be strings")
        if key not in names:
            raise ConfigError(join(path, key), value[key], unknown_rule("key", key, names))
    return value


def unknown_rule(what: str, given: str, allowed: Iterable[str]) -> str:
    """``unknown key; did you mean 'nodes'? allowed: nodes, gpus_per_node``."""
    names = tuple(allowed)
    close = difflib.get_close_matches(given, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown {what}; {hint}allowed: {', '.join(names)}"


def _at_most(path: str, value: Any, number: float, limit: str) -> None:
    maximum = getattr(limits, limit)
    if number > maximum:
        raise ConfigError(path, value, f"must be at most {limits.named(limit, maximum)}")


def positive_int(path: str, value: Any, limit: str = "MAX_INT") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(path, value, "must be a positive integer")
    _at_most(path, value, value, limit)
    return value


def non_negative_int(path: str, value: Any, limit: str = "MAX_INT") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(path, value, "must be a non-negative integer")
    _at_most(path, value, value, limit)
    return value


def _number(path: str, value: Any, rule: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, value, rule)
    try:
        number = float(value)
    except OverflowError:  # an integer beyond every float
        raise ConfigError(path, value, rule) from None
    if not math.isfinite(number):
        raise ConfigError(path, value, f"{rule} (finite)")
    return number


def positive_float(path: str, value: Any, limit: str = "MAX_NUMBER") -> float:
    rule = "must be a positive number"
    number = _number(path, value, rule)
    if number <= 0:
        raise ConfigError(path, value, rule)
    _at_most(path, value, number, limit)
    return number


def non_negative_float(path: str, value: Any, limit: str = "MAX_NUMBER") -> float:
    rule = "must be a number ≥ 0"
    number = _number(path, value, rule)
    if number < 0:
        raise ConfigError(path, value, rule)
    _at_most(path, value, number, limit)
    return number


def fraction(path: str, value: Any, *, closed_low: bool, closed_high: bool) -> float:
    """A number in [0, 1), (0, 1] … as the two flags say."""
    rule = f"must be a number in {'[' if closed_low else '('}0, 1{']' if closed_high else ')'}"
    number = _number(path, value, rule)
    low_ok = number >= 0 if closed_low else number > 0
    high_ok = number <= 1 if closed_high else number < 1
    if not (low_ok and high_ok):
        raise ConfigError(path, value, rule)
    return number


def boolean(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(path, value, "must be true or false")
    return value


def choice(path: str, value: Any, allowed: Iterable[str]) -> str:
    names = tuple(allowed)
    if not isinstance(value, str) or value not in names:
        raise ConfigError(path, value, f"must be one of {', '.join(names)}")
    return value


def path(path: str, value: Any) -> str:
    """A file or directory path, as a string ("" stands for "not given")."""
    if not isinstance(value, str) or "\0" in value:
        raise ConfigError(path, value, "must be a file path (a string without NUL)")
    return value


def optional_path(section: str, raw: Mapping[str, Any], key: str) -> str:
    """``raw[key]``, a file or folder path; "" when the key is absent. Given empty it is an
    error (an unset variable in a generated config), never "not given"."""
    if key not in raw:
        return ""
    value = raw[key]
    if value == "":
        raise ConfigError(join(section, key), value, "must be a path (given empty: an unset "
                          "variable?); leave the key out for the default")
    return path(join(section, key), value)


def name(path: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(path, value, "must be a non-empty string")
    return value
