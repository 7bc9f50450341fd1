"""Read a Hugging Face checkpoint by slices, straight into one rank's shard (effectful).

Every rank of a unit reads only what its own TP/PP position holds
(:func:`nereus.emu.hf_slices.shard_reads`): for each slice, ``safe_open(file).get_slice(name)``
indexed by the slice's box, copied into the unit's local tensor (its fp32 master under mixed
precision) and converted to its dtype there. No rank materialises the whole model, and the
bytes a rank reads are counted slice by slice (:class:`LoadStats`), so a test can check them
against the shard's size. Adam moments start at zero; the unused rows of a scalar head are
zero; a new value head's row comes from :func:`nereus.emu.hf_slices.value_head_row`.

Memory: safetensors maps a file and copies each slice out of the mapping; the pages a slice
touched stay resident while the file is open, so a file is reopened after every
``MAP_BUDGET_BYTES`` read, and a large slice is read in row chunks of at most that size. A
rank's peak is then its shard plus about one budget.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from nereus.config.checkpoint import ModelCheckpoint
from nereus.emu.boxes import Box
from nereus.emu.hf_slices import VALUE, ZERO, SliceRead, shard_reads, value_head_row
from nereus.emu.shards import tensor_specs
from nereus.emu.unit import Layout
from nereus.errors import ConfigError
from nereus.runtime.worker.state import FIELDS, UnitState

MAP_BUDGET_BYTES = 64 << 20


@dataclass
class LoadStats:
    """What one rank read: bytes of every slice (counted as read), slices, seconds (of which
    ``zero_s`` writing the zero Adam moments)."""

    bytes_read: int = 0
    slices: int = 0
    seconds: float = 0.0
    zero_s: float = 0.0
    files: set[str] = field(default_factory=set)


def _slices(box: Box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in zip(box.start, box.stop, strict=True))


def _chunks(r: SliceRead, itemsize: int) -> Iterator[SliceRead]:
    """``r`` cut into row ranges of at most MAP_BUDGET_BYTES."""
    shape = r.source_box.shape
    row_bytes = itemsize * int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else itemsize
    rows = max(1, MAP_BUDGET_BYTES // max(row_bytes, 1))
    if len(shape) == 1 or shape[0] <= rows:
        yield r
        return
    for a in range(0, shape[0], rows):
        b = min(shape[0], a + rows)
        src = Box((r.source_box.start[0] + a, *r.source_box.start[1:]),
                  (r.source_box.start[0] + b, *r.source_box.stop[1:]))
        dst = Box((r.target_box.start[0] + a, *r.target_box.start[1:]),
                  (r.target_box.start[0] + b, *r.target_box.stop[1:]))
        yield SliceRead(r.tensor, r.source, src, dst)


class CheckpointSource:
    """The initial state of a role's units from its checkpoint (the runtime's stand-in for a
    global logical state: :meth:`fill` writes one unit's shard; :meth:`whole` the global arrays
    of a tp=1, pp=1 unit, for engines that hold the whole model anyway)."""

    def __init__(self, ck: ModelCheckpoint, seed: int) -> None:
        self.ck = ck
        self.seed = seed  # the new value head's draw
        self.stats = LoadStats()

    def _read_into(self, reads: list[tuple[SliceRead, Any]]) -> None:
        """Execute ``reads`` (slice, destination view of its target box), file by file."""
        from safetensors import safe_open

        by_file: dict[str, list[tuple[SliceRead, Any]]] = {}
        for r, dst in reads:
            if r.source == ZERO:
                dst.zero_()
            elif r.source == VALUE:
                row = value_head_row(self.ck.spec.hidden_size, self.seed)
                dst.copy_(torch.from_numpy(row[_slices(r.source_box)[1]]).view(dst.shape))
            else:
                by_file.setdefault(self.ck.tensor(r.source).file, []).append((r, dst))
        field_ = f"models.{self.ck.role}.checkpoint"
        for name, items in sorted(by_file.items()):
            path = os.path.join(self.ck.directory, name)
            pending = list(items)
            while pending:
                mapped = 0
                try:
                    with safe_open(path, framework="pt") as fh:
                        while pending and mapped < MAP_BUDGET_BYTES:
                            r, dst = pending.pop(0)
                            got = fh.get_slice(r.source)[_slices(r.source_box)]
                            if tuple(got.shape) != tuple(dst.shape):
                                raise ConfigError(field_, self.ck.directory,
                                                  f"{r.source} in {name} gave a slice of shape "
                                                  f"{list(got.shape)} for {list(dst.shape)}")
                            dst.copy_(got)
                            n = got.numel() * got.element_size()
                            mapped += n
                            self.stats.bytes_read += n
                            self.stats.slices += 1
                except OSError as e:
                    raise ConfigError(field_, self.ck.directory,
                                      f"{name} cannot be read ({e.strerror or e})") from None
                self.stats.files.add(name)

    def _planned(self, layout: Layout, pp_rank: int, tp_rank: int,
                 dst_of: Any) -> list[tuple[SliceRead, Any]]:
        out = []
        for s, pc, r in shard_reads(self.ck.spec, layout, pp_rank, tp_rank, self.ck.head):
            itemsize = self.ck.tensor(r.source).itemsize if r.reads_file else 4
            for part in _chunks(r, itemsize):
                shift = tuple(a - b for a, b in zip(pc.local.start, pc.global_.start,
                                                    strict=True))
                out.append((part, dst_of(s.local_key)[_slices(part.target_box.shift(shift))]))
        return out

    def fill(self, st: UnitState) -> int:
        """Write this rank's shard of ``st`` from the checkpoint (zero Adam moments); returns
        the bytes read."""
        t0 = time.perf_counter()
        before = self.stats.bytes_read
        live = st.tensors()
        pp_rank, tp_rank = st.position
        with torch.no_grad():
            self._read_into(self._planned(st.emu.layout, pp_rank, tp_rank,
                                          lambda key: live["param"][key]))
            t1 = time.perf_counter()
            for f in FIELDS[1:]:
                for t in live[f].values():
                    t.zero_()
            self.stats.zero_s += time.perf_counter() - t1
        st.refresh_model()
        self._check_score_bias()
        self.stats.seconds += time.perf_counter() - t0
        return self.stats.bytes_read - before

    def whole(self) -> dict[str, dict[str, np.ndarray]]:
        """The global logical state (field → tensor → array) at tp=1, pp=1."""
        shapes = {t.name: t.global_shape for t in tensor_specs(self.ck.spec)}
        params = {n: torch.empty(shp, dtype=torch.float32) for n, shp in shapes.items()}
        with torch.no_grad():
            self._read_into(self._planned(Layout(1, 1), 0, 0, lambda key: params[key]))
        self._check_score_bias()
        glob: dict[str, dict[str, np.ndarray]] = {f: {} for f in FIELDS}
        for n, t in params.items():
            glob["param"][n] = t.numpy()
            glob["exp_avg"][n] = np.zeros_like(glob["param"][n])
            glob["exp_avg_sq"][n] = np.zeros_like(glob["param"][n])
        return glob

    def _check_score_bias(self) -> None:
        """A scalar head read from ``score`` has no bias in Megatron's layout: a checkpoint
        whose ``score.bias`` is not zero is refused (its values would be shifted)."""
        if self.ck.head != "score" or not any(t.name == "score.bias"
                                              for t in self.ck.facts.tensors):
            return
        from safetensors import safe_open

        t = self.ck.tensor("score.bias")
        with safe_open(os.path.join(self.ck.directory, t.file), framework="pt") as fh:
            bias = fh.get_tensor("score.bias")
        if bool((bias != 0).any()):
            raise ConfigError(f"models.{self.ck.role}.checkpoint", self.ck.directory,
                              "score.bias is not zero; Nereus's scalar head has no bias")
