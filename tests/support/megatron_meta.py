"""Read a Megatron model's own sharded_state_dict() metadata as boxes of global tensors.

Independent of nereus.emu.shards, so tests can check those rules against Megatron and load a
model "directly in the target layout" through Megatron's metadata alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

Part = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], int | None]


def megatron_parts(model: Any, dp_cp_group: Any) -> dict[str, tuple[str, list[Part], bool]]:
    """local key → (logical name with global layer index, parts, is a tp/dp replica).

    A part is (local start, local stop, global start, global stop, number of layers or None);
    parts of one local tensor are stacked along axis 0 (Megatron's SwiGLU factory chunks so).
    """
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    out: dict[str, tuple[str, list[Part], bool]] = {}
    sd = model.sharded_state_dict(metadata={"dp_cp_group": dp_cp_group})
    for key, item in sd.items():
        if isinstance(item, ShardedTensorFactory):
            shards = item.build()
        elif isinstance(item, ShardedTensor):
            shards = [item]
        else:
            continue
        parts: list[Part] = []
        row0 = 0
        gname = key
        for sh in shards:
            k = sh.prepend_axis_num
            if k:  # our logical name: the local key with the global layer index
                local_layer = key.split(".")[2]
                gname = key.replace(f"decoder.layers.{local_layer}.",
                                    f"decoder.layers.{sh.global_offset[0]}.", 1)
            lshape = tuple(sh.local_shape)  # excludes the prepended layer axis
            gstart = tuple(sh.global_offset[k:])
            lstart = (row0,) + (0,) * (len(lshape) - 1)
            parts.append((lstart, tuple(a + b for a, b in zip(lstart, lshape, strict=True)),
                          gstart, tuple(a + b for a, b in zip(gstart, lshape, strict=True)),
                          sh.global_shape[0] if k else None))
            row0 += lshape[0]
        rid = shards[0].replica_id
        replica = any(int(r) != 0 for r in (rid if isinstance(rid, tuple) else (rid,)))
        out[key] = (gname, parts, replica)
    return out


def load_via_megatron(state: Any, glob: dict[str, dict[str, np.ndarray]]) -> None:
    """Fill a UnitState's parameters and Adam moments from global arrays via Megatron metadata."""
    params = dict(state.model.named_parameters())
    with torch.no_grad():
        for key, (gname, parts, _) in megatron_parts(state.model, state.groups.solo).items():
            p = params[key]
            st = state.optimizer.state[p]
            for ls, le, gs, ge, _n in parts:
                lo = tuple(slice(a, b) for a, b in zip(ls, le, strict=True))
                g = tuple(slice(a, b) for a, b in zip(gs, ge, strict=True))
                for f, t in (("param", p.data), ("exp_avg", st["exp_avg"]),
                             ("exp_avg_sq", st["exp_avg_sq"])):
                    t[lo] = torch.from_numpy(np.ascontiguousarray(glob[f][gname][g]))
