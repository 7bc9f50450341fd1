"""The kernels' descriptor table: one int64 row per slice, work partitioned into tiles (numpy).

Mirrors ``kernels/common/pack_api.h`` field for field (a test parses the header and compares).
A slice's tiles are either segments of ``tile_bytes`` of one long row or runs of whole short
rows; ``FIRST_TILE`` is the prefix sum of the per-slice tile counts, so one launch of
``n_tiles`` tile-blocks covers every slice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nereus.errors import TransitionError
from nereus.kernels.slices import RowGeometry

LAYOUT_VERSION = 1
DESC_FIELDS = 16
STRIDED_PTR = 0
PACKED_PTR = 1
ROW_BYTES = 2
ROWS = 3
N1 = 4
N2 = 5
S0 = 6
S1 = 7
S2 = 8
SEG_BYTES = 9
TILES_PER_ROW = 10
TILE_ROWS = 11
VEC_BYTES = 12
FIRST_TILE = 13
N_TILES = 14

MAX_VEC_BYTES = 16
MAX_TILE_BYTES = 1 << 24
MAX_ROWS = (1 << 31) - 1  # the kernels index rows in 32 bits


def fits(geometry: RowGeometry) -> bool:
    """True when the kernels can index this slice (else the torch fallback copies it)."""
    return geometry.rows <= MAX_ROWS
DEFAULT_TILE_BYTES = 32 * 1024


@dataclass(frozen=True)
class Copy:
    """One slice to copy: the address of its origin on the strided side, the address of its
    first byte in the packed buffer, and its geometry."""

    strided_ptr: int
    packed_ptr: int
    geometry: RowGeometry


def vec_bytes(copy: Copy) -> int:
    """The widest copy unit (16, 8, 4, 2 or 1 bytes) that every address of the slice allows."""
    g = copy.geometry
    values = [copy.strided_ptr, copy.packed_ptr, g.row_bytes, MAX_VEC_BYTES]
    values += [s for n, s in zip(g.outer_sizes, g.outer_strides_bytes, strict=True) if n > 1]
    common = math.gcd(*values)
    return common & -common


def build_table(
    copies: Sequence[Copy], tile_bytes: int = DEFAULT_TILE_BYTES
) -> tuple[np.ndarray, int]:
    """(table of shape (len(copies), DESC_FIELDS), total tiles) for non-empty ``copies``."""
    if tile_bytes < MAX_VEC_BYTES or tile_bytes > MAX_TILE_BYTES or tile_bytes & (tile_bytes - 1):
        raise TransitionError(
            f"tile_bytes={tile_bytes}: needs a power of two in [{MAX_VEC_BYTES}, {MAX_TILE_BYTES}]"
        )
    table = np.zeros((len(copies), DESC_FIELDS), dtype=np.int64)
    first_tile = 0
    for i, copy in enumerate(copies):
        g = copy.geometry
        if g.nbytes == 0:
            raise TransitionError(f"copy {i}: empty slices are left out of the table")
        if not fits(g):
            raise TransitionError(f"copy {i}: {g.rows} rows, the kernels index at most {MAX_ROWS}")
        row = table[i]
        row[STRIDED_PTR] = copy.strided_ptr
        row[PACKED_PTR] = copy.packed_ptr
        row[ROW_BYTES] = g.row_bytes
        row[ROWS] = g.rows
        row[N1] = g.outer_sizes[1]
        row[N2] = g.outer_sizes[2]
        row[S0], row[S1], row[S2] = g.outer_strides_bytes
        if g.row_bytes > tile_bytes:
            tiles_per_row = -(-g.row_bytes // tile_bytes)
            row[SEG_BYTES] = tile_bytes
            row[TILES_PER_ROW] = tiles_per_row
            row[TILE_ROWS] = 1
            n_tiles = g.rows * tiles_per_row
        else:
            tile_rows = max(1, tile_bytes // g.row_bytes)
            row[SEG_BYTES] = g.row_bytes
            row[TILES_PER_ROW] = 1
            row[TILE_ROWS] = tile_rows
            n_tiles = -(-g.rows // tile_rows)
        row[VEC_BYTES] = vec_bytes(copy)
        row[FIRST_TILE] = first_tile
        row[N_TILES] = n_tiles
        first_tile += n_tiles
    return table, first_tile
