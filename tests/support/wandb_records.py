"""The history rows of an offline wandb run (``run-*.wandb``), read back for the tests: the file
is wandb's LevelDB-style log (a 7-byte header, then 32 KiB blocks of records, each a 7-byte header
— crc32, length, type FULL/FIRST/MIDDLE/LAST — and a piece of a protobuf ``Record``)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768
HEADER = 7


def history(path: Path) -> list[dict[str, float]]:
    """Every ``wandb.log`` row of the run, in order, with its ``_step``."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    pos, parts, rows = HEADER, b"", []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:  # block padding
            pos += left
            continue
        parts += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            rec = pb.Record()
            rec.ParseFromString(parts)
            parts = b""
            if rec.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in rec.history.item})
    return rows
