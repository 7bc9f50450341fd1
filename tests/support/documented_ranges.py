"""The range of every config field whose rule docs/config.md states in a form a test can read,
read from that page's tables (so a test that uses it checks the code against the documentation).

Each row ``| `field` | type | default | rule |`` of the ``job``, model-architecture, ``cluster``,
``controller`` and ``runtime`` tables becomes a :class:`Field` with a *kind* when its type and the
start of its rule are one of: an integer ``> 0`` or ``≥ 0``; a number ``> 0``, ``≥ 0``,
``in [0, 1)`` or ``in (0, 1]`` (finite: docs/config.md, "Types are strict"); a bool; or a string
``one of `a`, `b`, …`` / ```a` or `b```. Other rows (paths, presets, mappings, rules in words)
are left out. :func:`out_of_range` lists values the documentation rules out for a kind, and
:func:`in_range` says whether a value is inside it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from support.paths import REPO

DOC = REPO / "docs" / "config.md"
# table heading in docs/config.md → where its fields sit in the tiny example's document
SECTIONS = {"### `job`": ("job",), "### `models`": ("models", "reward"),
            "### `cluster`": ("cluster",), "### `controller`": ("controller",),
            "### `runtime`": ("runtime",)}
ROW = re.compile(r"^\| `([a-z0-9_.]+)` \| ([^|]+) \| [^|]* \| (.*) \|$")


@dataclass(frozen=True)
class Field:
    path: tuple[str, ...]
    kind: str  # int>0 | int>=0 | num>0 | num>=0 | num[0,1) | num(0,1] | bool | enum
    choices: tuple[str, ...] = ()
    rule: str = ""

    @property
    def name(self) -> str:
        return ".".join(self.path)


def _kind(typ: str, rule: str) -> tuple[str, tuple[str, ...]] | None:
    typ = typ.strip()
    if typ in ("int", "int ≥ 0"):
        if typ == "int ≥ 0" or rule.startswith("≥ 0"):
            return "int>=0", ()
        return ("int>0", ()) if rule.startswith("> 0") else None
    if typ in ("number", "float ≥ 0"):
        for start, kind in (("> 0", "num>0"), ("≥ 0", "num>=0"), ("in [0, 1)", "num[0,1)"),
                            ("in (0, 1]", "num(0,1]")):
            if rule.startswith(start) or (typ == "float ≥ 0" and kind == "num>=0"):
                return kind, ()
        return None
    if typ == "bool":
        return "bool", ()
    if typ == "string":
        m = re.match(r"one of ((?:`[a-z0-9-]+`(?:, )?)+)", rule) or \
            re.match(r"(`[a-z0-9-]+` or `[a-z0-9-]+`)", rule)
        if m:
            return "enum", tuple(re.findall(r"`([a-z0-9-]+)`", m.group(1)))
    return None


def documented_fields() -> list[Field]:
    out: list[Field] = []
    where: tuple[str, ...] | None = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("### "):
            where = next((p for h, p in SECTIONS.items() if line.startswith(h)), None)
            continue
        m = ROW.match(line)
        if where is None or not m:
            continue
        name, typ, rule = m.groups()
        got = _kind(typ, rule.strip())
        if got is None or name == "nodes":  # nodes: an int or a list of node groups
            continue
        out.append(Field((*where, *name.split(".")), got[0], got[1], rule.strip()))
    return out


BAD: dict[str, tuple[Any, ...]] = {
    "int>0": (0, -1, -(10**30), True, False, 8.0, "8", None, [1]),
    "int>=0": (-1, -(10**30), True, 1.0, "0", None),
    "num>0": (0, 0.0, -0.5, -1e300, math.nan, math.inf, -math.inf, True, "1.0", None),
    "num>=0": (-1e-9, -1, math.nan, math.inf, -math.inf, False, "0", None),
    "num[0,1)": (1.0, 1, 1.5, -0.1, math.nan, math.inf, True, None),
    "num(0,1]": (0, 0.0, 1.0001, -1, math.nan, math.inf, True, None),
    "bool": (0, 1, "true", "yes", None, 1.0),
}


def out_of_range(f: Field) -> tuple[Any, ...]:
    """Values the documentation rules out for ``f``."""
    if f.kind == "enum":
        return ("not-a-choice", "", 1, None, True, f.choices[0].upper())
    return BAD[f.kind]


def in_range(f: Field, v: Any) -> bool:
    """Whether ``v`` is inside ``f``'s documented range (type included)."""
    if f.kind == "bool":
        return isinstance(v, bool)
    if f.kind == "enum":
        return isinstance(v, str) and v in f.choices
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    if f.kind.startswith("int"):
        return isinstance(v, int) and (v > 0 if f.kind == "int>0" else v >= 0)
    if not math.isfinite(v):
        return False
    return {"num>0": v > 0, "num>=0": v >= 0, "num[0,1)": 0 <= v < 1,
            "num(0,1]": 0 < v <= 1}[f.kind]
