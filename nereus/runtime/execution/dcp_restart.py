"""Checkpoint/restart resharding baseline with torch.distributed.checkpoint (effectful).

What users do today instead of a live transition: every rank of one replica writes its shards
(each piece as one entry keyed by its global box), the job restarts in the new layout, and every
new rank reads the entries that intersect its shards. Megatron's own dist-checkpointing calls
``torch.cuda.synchronize`` while saving and cannot run on CPU ranks, so the box bookkeeping here
is ours; the file format and collective I/O are torch.distributed.checkpoint's.

``save_global``/``latest_global``: the periodic checkpoint of ``nereus run`` — the logical
global state at a step boundary as one .npz (written by the controller rank), read back when
every replica of some model-stage was lost with dead ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed.checkpoint as dcp

from nereus.emu.boxes import Box, intersect
from nereus.emu.unit import Emu
from nereus.runtime.execution.torch_executor import META_VALUES, meta_of
from nereus.runtime.worker.state import FIELDS, Counters, UnitState


def _key(f: str, tensor: str, box: Box) -> str:
    return f"{f}|{tensor}|{','.join(map(str, box.start))}|{','.join(map(str, box.stop))}"


def _parse(key: str) -> tuple[str, str, Box]:
    f, tensor, start, stop = key.split("|")
    return f, tensor, Box(tuple(int(x) for x in start.split(",")),
                          tuple(int(x) for x in stop.split(",")))


def _sl(b: Box) -> tuple[slice, ...]:
    return tuple(slice(x, y) for x, y in zip(b.start, b.stop, strict=True))


def save_units(path: str, units: Sequence[UnitState], writer: Emu | None) -> None:
    """Collective over the default group: the ranks of ``writer`` (one replica) write its shards;
    every other rank takes part with nothing to write."""
    sd: dict[str, torch.Tensor] = {}
    for st in units:
        if st.emu != writer:
            continue
        if st.global_rank == writer.gpus[0]:
            sd["meta"] = meta_of(st)
        live = st.tensors()
        for s in st.shards():
            if s.tp_replica:
                continue
            for f in FIELDS:
                for pc in s.pieces:
                    sd[_key(f, s.tensor, pc.global_)] = live[f][s.local_key][_sl(pc.local)]
    dcp.save(sd, checkpoint_id=path)


def load_units(path: str, units: Sequence[UnitState]) -> None:
    """Collective over the default group: fill every unit of this rank from the checkpoint."""
    keys = [k for k in dcp.FileSystemReader(path).read_metadata().state_dict_metadata if k != "meta"]
    entries = [_parse(k) for k in keys]
    by_tensor: dict[tuple[str, str], list[Box]] = {}
    for f, tensor, box in entries:
        by_tensor.setdefault((f, tensor), []).append(box)
    wanted: dict[str, torch.Tensor] = {"meta": torch.empty(META_VALUES, dtype=torch.int64)}
    copies: list[tuple[str, Box, torch.Tensor]] = []
    for st in units:
        live = st.tensors()
        for s in st.shards():
            for f in FIELDS:
                for pc in s.pieces:
                    for box in by_tensor[(f, s.tensor)]:
                        common = intersect(box, pc.global_)
                        if common is None:
                            continue
                        key = _key(f, s.tensor, box)
                        wanted.setdefault(key, torch.empty(box.shape))
                        local = common.shift(tuple(a - b for a, b in
                                                   zip(pc.local.start, pc.global_.start,
                                                       strict=True)))
                        copies.append((key, common.shift(tuple(-x for x in box.start)),
                                       live[f][s.local_key][_sl(local)]))
    dcp.load(wanted, checkpoint_id=path)
    with torch.no_grad():
        for key, in_entry, view in copies:
            view.copy_(wanted[key][_sl(in_entry)])
    meta = [int(v) for v in wanted["meta"]]
    for st in units:
        st.counters = Counters(*meta[:4])
        for opt_state in st.optimizer.state.values():
            opt_state["step"].fill_(float(meta[4]))
        st.refresh_model()
