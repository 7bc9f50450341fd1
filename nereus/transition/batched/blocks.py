"""The batched DAG's records: primitive blocks, edge chunks and a model-stage's local DAG over
GPU arrays (one row of GPU ids per unit), with the codes they use."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from nereus.emu.regions import sub_index_n
from nereus.emu.unit import Layout

DESTROY, SPLIT, EXTEND, MERGE = 0, 1, 2, 3  # KIND_ORDER codes: release first
EDGE_CODES = ("data", "local", "resource", "order", "memory")
DATA, LOCAL, RESOURCE, ORDER, MEMORY = range(5)
INTERLEAVED, CONTIGUOUS = 0, 1
NONE = -(1 << 40)  # "no such primitive": stays negative after adding any offset
EMPTY = np.zeros(0, dtype=np.int64)


_IOTA = np.arange(1 << 16, dtype=np.int64)
_IOTA.flags.writeable = False


def iota(lo: int, hi: int) -> np.ndarray:
    """``np.arange(lo, hi)`` (int64, ``0 <= lo <= hi``), read-only: a view of one array where
    it reaches far enough (no allocation)."""
    return _IOTA[lo:hi] if hi <= _IOTA.size else np.arange(lo, hi, dtype=np.int64)


# a row of 2, 4 or 8 flags read as one unsigned word (all set: 0x01…01)
_WORDS = {k: (np.dtype(f"u{k}"), np.array(int("01" * k, 16), dtype=f"u{k}")) for k in (2, 4, 8)}


def _words(flags: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Each row of boolean ``flags`` (2, 4 or 8 wide, contiguous) as one unsigned word, and the
    word of an all-true row; None for other rows."""
    word = _WORDS.get(flags.shape[-1])
    if word is None or not flags.flags.c_contiguous:
        return None
    return flags.view(word[0]).reshape(flags.shape[:-1]), word[1]


def row_any(flags: np.ndarray) -> np.ndarray:
    """``flags.any(-1)`` for boolean ``flags`` (cheaper for rows of 1, 2, 4 or 8)."""
    if flags.shape[-1] == 1:
        return flags[..., 0]
    got = _words(flags)
    if got is None:
        out: np.ndarray = np.logical_or.reduce(flags, axis=-1)
        return out
    return got[0].astype(bool)


def row_all(flags: np.ndarray) -> np.ndarray:
    """``flags.all(-1)`` for boolean ``flags`` (cheaper for rows of 1, 2, 4 or 8)."""
    if flags.shape[-1] == 1:
        return flags[..., 0]
    got = _words(flags)
    if got is None:
        out: np.ndarray = np.logical_and.reduce(flags, axis=-1)
        return out
    return got[0] == got[1]


_NONES = np.full(1 << 16, NONE, dtype=np.int64)
_NONES.flags.writeable = False
_MINUS = np.full(1 << 16, -1, dtype=np.int64)
_MINUS.flags.writeable = False


def _filled(template: np.ndarray, n: int) -> np.ndarray:
    """A new array of ``n`` entries of ``template``'s value (a copy of its prefix)."""
    if n <= template.size:
        return template[:n].copy()
    out = np.empty(n, dtype=np.int64)
    out.fill(template[0])
    return out


def none_array(n: int) -> np.ndarray:
    """``n`` entries of :data:`NONE` (a new array)."""
    return _filled(_NONES, n)


def minus_ones(n: int) -> np.ndarray:
    """``n`` entries of -1 (a new array)."""
    return _filled(_MINUS, n)


@dataclass(frozen=True)
class Block:
    """``len(rows)`` primitives of one kind at local indices ``start …``.

    ``rows``: Split — source units (layout ``lay``, split into ``sub``); Merge — merged units
    (layout ``lay``, from parts of layout ``sub``); Extend — source units (``lay``), with the new
    units in ``new``; Destroy — the destroyed units (``lay``). ``grouping`` per Split / Merge.
    """

    kind: int
    start: int
    rows: np.ndarray
    lay: Layout
    sub: Layout | None = None
    new: np.ndarray | None = None
    grouping: np.ndarray | None = None
    contiguous: bool = False  # some member uses the contiguous grouping

    @property
    def count(self) -> int:
        return int(self.rows.shape[0])


def block(kind: int, start: int, rows: np.ndarray, lay: Layout, sub: Layout | None = None,
          new: np.ndarray | None = None, grouping: np.ndarray | None = None,
          contiguous: bool = False) -> Block:
    """``Block(...)`` without the frozen ``__init__`` (one attribute store per field; the
    planner builds a dozen per transition and this is on its clock)."""
    b = object.__new__(Block)
    b.__dict__.update(kind=kind, start=start, rows=rows, lay=lay, sub=sub, new=new,
                      grouping=grouping, contiguous=contiguous)
    return b


@dataclass
class Edges:
    """Edge chunks ``(before, after, kind, section, owner, part, sub)``: the arrays of one kind
    and what orders them as the reference appends them, the key ``(section, owner, part,
    sub)`` (computed only when expanding). An entry whose ``before`` or ``after`` is negative
    (:data:`NONE`) is no edge; they are dropped once, over all chunks."""

    chunks: list[tuple[np.ndarray, np.ndarray, int, int, np.ndarray,
                       np.ndarray | int, np.ndarray | int]] = field(default_factory=list)

    def add(self, a: np.ndarray, b: np.ndarray, kind: int, sec: int, owner: np.ndarray,
            part: np.ndarray | int, sub: np.ndarray | int) -> None:
        if a.size:
            self.chunks.append((a, b, kind, sec, owner, part, sub))


@dataclass
class LocalArrays:
    """One model-stage's local DAG (local indices), as :class:`local.LocalDag` holds it: filled
    while it is built, then held unchanged by the frozen :class:`fast_assemble.BatchedDag`."""

    stage: str
    state: str
    blocks: list[Block]
    n: int
    edges: Edges
    release: np.ndarray  # GPU → local index of the Destroy that frees it (negative: none)
    donor: bool = False
    staged: bool = False
    t_sub: Layout | None = None
    staging: tuple[int, ...] = ()
    levels: np.ndarray | None = None  # GPU → most bytes held (co-resident memory check)


def new_local(stage: str, state: str, blocks: list[Block], n: int, release: np.ndarray,
              t_sub: Layout | None = None) -> LocalArrays:
    """``LocalArrays(stage, state, blocks, n, Edges(), release, t_sub=t_sub)`` without the
    dataclass ``__init__`` (built once per model-stage per planning, on its clock)."""
    edges = object.__new__(Edges)
    edges.__dict__["chunks"] = []
    loc = object.__new__(LocalArrays)
    loc.__dict__.update(stage=stage, state=state, blocks=blocks, n=n, edges=edges,
                        release=release, donor=False, staged=False, t_sub=t_sub, staging=(),
                        levels=None)
    return loc


@lru_cache(maxsize=4096)
def sub_index(tp: int, pp: int, sub_tp: int, sub_pp: int, grouping: int) -> np.ndarray:
    """Positions (k × |sub|) of the sub-units of a (tp, pp) unit split into (sub_tp, sub_pp)."""
    grp = "interleaved" if grouping == INTERLEAVED else "contiguous"
    out = np.array(sub_index_n(tp, pp, sub_tp, sub_pp, grp), dtype=np.int64)
    out.flags.writeable = False
    return out
