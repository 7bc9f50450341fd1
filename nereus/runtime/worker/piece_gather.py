"""All-gathering shard pieces over a torch.distributed group as plain tensors (effectful).

A rank's pieces — ``(field, tensor name, global start, global stop, values)``, as
:func:`nereus.runtime.worker.units.local_pieces` lists them — travel as three all-gathers of
tensors: the counts (rows, bytes), a table of int64 rows ``[field, tensor, dtype, ndim,
start…, stop…]`` (indices into lists every rank holds: the fields asked for, the model's tensor
names in sorted order, :data:`DTYPES`) and the values' raw bytes, each piece at the next
8-byte boundary. Every receiver checks every row against the model's global shapes — a known
field, tensor and dtype, the tensor's rank, ``0 <= start <= stop <= shape``, its bytes inside
what arrived — and the counts against the whole model's size before it allocates or reads
anything; a bad one is a :class:`~nereus.errors.CommunicationError`. Nothing received is
unpickled: torch's ``*_object`` collectives unpickle what arrives over the group's sockets,
so Nereus uses none (``tests/pure/test_network_exposure.py`` checks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nereus.errors import CommunicationError

DTYPES = ("float32", "float64", "float16", "int64", "int32", "uint8")
HEAD = 4  # field, tensor, dtype, ndim; then ndim-padded starts and stops
ALIGN = 8
Piece = tuple[str, str, tuple[int, ...], tuple[int, ...], np.ndarray]


def _width(shapes: Mapping[str, tuple[int, ...]]) -> int:
    return HEAD + 2 * max((len(s) for s in shapes.values()), default=0)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def limits(shapes: Mapping[str, tuple[int, ...]], fields: Sequence[str]) -> tuple[int, int]:
    """(rows, bytes) no rank can exceed: every field of the whole model, one row per element
    at most, 8 bytes per element plus alignment."""
    elements = sum(int(np.prod(s, dtype=np.int64)) for s in shapes.values()) * len(fields)
    rows = elements + len(shapes) * len(fields)
    return rows, 8 * elements + ALIGN * rows


def encode(pieces: Sequence[Piece], shapes: Mapping[str, tuple[int, ...]],
           fields: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(table, bytes) of this rank's ``pieces``; ValueError for a piece the receivers would
    refuse (an unknown field, tensor or dtype, a box outside the tensor, values of another
    shape)."""
    names = sorted(shapes)
    width = _width(shapes)
    table = np.zeros((len(pieces), width), dtype=np.int64)
    offset = 0
    blobs = []
    for i, (f, name, start, stop, arr) in enumerate(pieces):
        if f not in fields or name not in shapes or arr.dtype.name not in DTYPES:
            raise ValueError(f"piece {i}: field {f!r}, tensor {name!r}, dtype {arr.dtype}")
        nd = len(shapes[name])
        box = tuple(b - a for a, b in zip(start, stop, strict=True))
        if len(start) != nd or not all(0 <= a <= b <= s for a, b, s
                                       in zip(start, stop, shapes[name], strict=True)):
            raise ValueError(f"piece {i}: box {start}..{stop} outside {name} {shapes[name]}")
        if arr.shape != box:
            raise ValueError(f"piece {i}: values of shape {arr.shape} for the box {box}")
        table[i, :HEAD] = (fields.index(f), names.index(name), DTYPES.index(arr.dtype.name), nd)
        table[i, HEAD:HEAD + nd] = start
        table[i, HEAD + nd:HEAD + 2 * nd] = stop
        offset = _aligned(offset)
        blobs.append((offset, np.ascontiguousarray(arr).reshape(-1).view(np.uint8)))
        offset += arr.nbytes
    data = np.zeros(offset, dtype=np.uint8)
    for at, blob in blobs:
        data[at:at + blob.size] = blob
    return table, data


def decode(table: np.ndarray, data: np.ndarray, shapes: Mapping[str, tuple[int, ...]],
           fields: Sequence[str], sender: str = "a peer") -> list[Piece]:
    """The pieces of one rank's (table, bytes); CommunicationError for a row that does not
    fit the model (nothing is read before its row is checked)."""
    names = sorted(shapes)
    width = _width(shapes)
    where = f"piece all-gather: {sender}"
    if table.ndim != 2 or table.shape[1] != width:
        raise CommunicationError(f"{where}: a table of shape {table.shape}, not (n, {width})")
    out: list[Piece] = []
    offset = 0
    for i, row in enumerate(table.tolist()):
        fi, ni, di, nd = row[:HEAD]
        if not (0 <= fi < len(fields) and 0 <= ni < len(names) and 0 <= di < len(DTYPES)):
            raise CommunicationError(f"{where}: row {i} names field {fi}, tensor {ni}, dtype "
                                     f"{di} (of {len(fields)}, {len(names)}, {len(DTYPES)})")
        name = names[ni]
        shape = shapes[name]
        start, stop = tuple(row[HEAD:HEAD + nd]), tuple(row[HEAD + nd:HEAD + 2 * nd])
        if nd != len(shape) or not all(0 <= a <= b <= s for a, b, s
                                       in zip(start, stop, shape, strict=True)):
            raise CommunicationError(f"{where}: row {i}: box {start}..{stop} outside {name} "
                                     f"{shape}")
        dt = np.dtype(DTYPES[di])
        box = tuple(b - a for a, b in zip(start, stop, strict=True))
        n = int(np.prod(box, dtype=np.int64)) * dt.itemsize
        offset = _aligned(offset)
        if offset + n > data.size:
            raise CommunicationError(f"{where}: row {i}: {n} bytes at {offset} overrun the "
                                     f"{data.size} bytes sent")
        arr = data[offset:offset + n].copy().view(dt).reshape(box)
        out.append((fields[fi], name, start, stop, arr))
        offset += n
    return out


def all_gather_pieces(pieces: Sequence[Piece], group: Any, device: Any,
                      shapes: Mapping[str, tuple[int, ...]],
                      fields: Sequence[str] = ("param",)) -> list[list[Piece]]:
    """Every member's pieces, in group-rank order (collective on ``group``); ``device``: where
    the group's tensors live (the CPU for gloo, the rank's GPU for NCCL/RCCL)."""
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group)
    table, data = encode(pieces, shapes, fields)
    counts = [torch.zeros(2, dtype=torch.int64, device=device) for _ in range(size)]
    dist.all_gather(counts, torch.tensor([len(table), data.size], dtype=torch.int64,
                                         device=device), group=group)
    got = [tuple(int(x) for x in c.cpu().tolist()) for c in counts]
    max_rows, max_bytes = limits(shapes, fields)
    for r, (rows, nbytes) in enumerate(got):
        if not (0 <= rows <= max_rows and 0 <= nbytes <= max_bytes):
            raise CommunicationError(f"piece all-gather: group rank {r} announces {rows} rows "
                                     f"and {nbytes} bytes (at most {max_rows}, {max_bytes})")
    width = _width(shapes)
    most_rows = max(1, *(rows for rows, _ in got))  # never an empty collective
    most_bytes = max(1, *(nbytes for _, nbytes in got))
    mine_t = torch.zeros((most_rows, width), dtype=torch.int64, device=device)
    mine_t[:len(table)] = torch.from_numpy(table).to(device)
    tables = [torch.empty_like(mine_t) for _ in range(size)]
    dist.all_gather(tables, mine_t, group=group)
    mine_d = torch.zeros(most_bytes, dtype=torch.uint8, device=device)
    mine_d[:data.size] = torch.from_numpy(data).to(device)
    datas = [torch.empty_like(mine_d) for _ in range(size)]
    dist.all_gather(datas, mine_d, group=group)
    return [decode(tables[r][:got[r][0]].cpu().numpy(), datas[r][:got[r][1]].cpu().numpy(),
                   shapes, fields, f"group rank {r}") for r in range(size)]
