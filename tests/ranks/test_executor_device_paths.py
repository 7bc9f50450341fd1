"""The executor's GPU code paths, run on CPU ranks over gloo (4 ranks, real Megatron GPTModels).

- the kernel path: every packed message packed and unpacked by the pack kernels' own device
  code (the host mode of kernels/common/pack_kernel.h, :mod:`nereus.kernels.host_mode`) through
  :class:`nereus.runtime.execution.packer.Packer` — the code a GPU rank runs with
  ``nereus._kernels``;
- the staged host transport: every message copied through host buffers, as GPU ranks sharing
  one GPU (or of different vendors) send device tensors over gloo;
- mixed precision: bf16 parameters with fp32 master weights and Adam state
  (:class:`nereus.runtime.worker.precision.MixedPrecisionAdam`), as units on a GPU hold them,
  moved by Split / Merge / Extend and the weight sync.
After every primitive the global logical state is reassembled and compared bit for bit.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch
from support.shard_cases import global_state

from nereus.emu.primitives import Destroy, consumed, extend_node, merge_node, produced, split_node
from nereus.emu.shards import shards_at, tensor_specs
from nereus.emu.unit import Emu, Layout
from nereus.spec.model import TINY_GPT

pytestmark = pytest.mark.slow
WORLD = 4
SPEC = TINY_GPT
COUNTERS = (7, 2, 5, 11)
STEP = 3.0
RUN_IDS = itertools.count(1000)


def all_four() -> tuple[Emu, list[Any]]:
    """Extend (1,2) → 2 replicas, Merge into (2,2), Split into four (1,1), Destroy one."""
    a = Emu("actor-train", "s", Layout(1, 2), (0, 1))
    x = extend_node(a, (2, 3))
    m = merge_node([a, x.new], Layout(2, 2))
    s = split_node(m.into, Layout(1, 1))
    return a, [x, m, s, Destroy(s.into[0], 0)]


def _snapshot(ex: Any) -> dict[Emu, Any]:
    out = {}
    for emu, st in ex.units.items():
        params = dict(st.model.named_parameters())
        casts = {k: bool(torch.equal(p.data, st.master_of(p).to(p.dtype)))
                 for k, p in params.items()}
        out[emu] = (st.position, st.snapshot(), tuple(vars(st.counters).values()),
                    st.step_value(), all(casts.values()), str(next(iter(params.values())).dtype))
    return out


def _run(rank: int, world: int, store: Any, initial: Emu, ops: list[Any], seed: int,
         run_id: int, mode: str, lib_dir: str) -> dict[str, Any]:
    import nereus.runtime.execution.pack as rpack
    from nereus.kernels.host_mode import build_host_library, host_launch, load_host_library
    from nereus.runtime.execution.device import RankDevice
    from nereus.runtime.execution.packer import Packer
    from nereus.runtime.execution.torch_executor import TorchExecutor
    from nereus.runtime.worker.state import Counters, load_global

    launches = [0]
    device = RankDevice.cpu(rank, world)
    if mode == "kernels":
        inner = host_launch(load_host_library(build_host_library(lib_dir)), threads=64)

        def counted(table: Any, n_tiles: int, to_tensors: bool) -> None:
            launches[0] += 1
            inner(table, n_tiles, to_tensors)

        device.packer = Packer("kernels:host", counted)
    elif mode == "staged":
        device.force_staging = True
    elif mode == "bf16":
        device = RankDevice(device.choice, device.placements, rank, dtype=torch.bfloat16)
    saved = rpack.DIRECT_MIN_VALUES
    # kernels: every item packed (the kernel path); staged: every item direct and staged too
    rpack.DIRECT_MIN_VALUES = 1 << 40 if mode == "kernels" else 1
    try:
        ex = TorchExecutor(SPEC, rank, store, f"dev{run_id}", timeout_s=60.0, device=device)
        ex.split_allgather = mode == "kernels"  # the all-gather's padded pack and slot unpacks
        ex.create(initial, counters=Counters(*COUNTERS), step=STEP)
        if initial in ex.units:
            load_global(ex.units[initial], global_state(seed))
        snaps = [_snapshot(ex)]
        live = {initial}
        for op in ops:
            if isinstance(op, Destroy):
                ex.destroy(op, live)
            else:
                getattr(ex, type(op).__name__.lower())(op)
            live = (live - set(consumed(op))) | set(produced(op))
            snaps.append(_snapshot(ex))
    finally:
        rpack.DIRECT_MIN_VALUES = saved
    return {"snaps": snaps, "launches": launches[0], "transports": dict(ex.transports),
            "staged_bytes": ex.stats.get("staged_bytes", 0)}


def _assemble(emu: Emu, per_rank: list[dict[Emu, Any]]) -> tuple[dict[str, Any], set[Any]]:
    glob = {f: {t.name: np.full(t.global_shape, np.nan, dtype=np.float32)
                for t in tensor_specs(SPEC)} for f in ("param", "exp_avg", "exp_avg_sq")}
    meta = set()
    for gpu in emu.gpus:
        (pp_rank, tp_rank), snap, counters, step, cast_ok, dtype = per_rank[gpu][emu]
        meta.add((counters, step, cast_ok, dtype))
        for s in shards_at(SPEC, emu.layout, pp_rank, tp_rank):
            for f, arrays in snap.items():
                local = arrays[s.local_key]
                for pc in s.pieces:
                    g = tuple(slice(a, b) for a, b in zip(pc.global_.start, pc.global_.stop,
                                                          strict=True))
                    lo = tuple(slice(a, b) for a, b in zip(pc.local.start, pc.local.stop,
                                                           strict=True))
                    glob[f][s.tensor][g] = local[lo]
    return glob, meta


@pytest.fixture
def pool() -> Any:
    from support.gloo_harness import shared_pool

    return shared_pool(WORLD)


@pytest.mark.parametrize("mode", ["kernels", "staged", "bf16"])
def test_executor_paths_preserve_state_bit_for_bit(pool: Any, mode: str,
                                                   tmp_path_factory: Any) -> None:
    from nereus.kernels.host_mode import compiler

    if mode == "kernels" and compiler() is None:
        pytest.skip("no C++ compiler for the kernels' host mode")
    lib_dir = str(tmp_path_factory.mktemp("hostlib"))
    initial, ops = all_four()
    results = pool.run(_run, initial, ops, 7, next(RUN_IDS), mode, lib_dir)
    want = global_state(7)
    live = [initial]
    for i in range(len(ops) + 1):
        if i:
            live = [u for u in live if u not in consumed(ops[i - 1])] + list(produced(ops[i - 1]))
        per_rank = [r["snaps"][i] for r in results]
        for emu in live:
            glob, meta = _assemble(emu, per_rank)
            dtype = "torch.bfloat16" if mode == "bf16" else "torch.float32"
            assert meta == {(COUNTERS, STEP, True, dtype)}, (i, emu, meta)
            for f in want:
                for name, arr in want[f].items():
                    assert np.array_equal(glob[f][name], arr), (mode, i, emu, f, name)
    if mode == "kernels":  # every rank that moved data did it through the kernels' code
        assert all(r["launches"] > 0 for r in results), [r["launches"] for r in results]
    if mode == "staged":
        assert all(r["staged_bytes"] > 0 for r in results), [r["staged_bytes"] for r in results]
        assert {k for r in results for k in r["transports"]} == {"host:gloo-forced"}
    else:
        assert {k for r in results for k in r["transports"]} == {"host:gloo"}


def _train_and_sync(rank: int, world: int, store: Any, run_id: int) -> dict[str, Any]:
    """Two units of one model in bf16 with fp32 masters: train one a step on rank 0, weight
    sync into the other on rank 1 (staged), compare."""
    from support.unit_training import train_step

    from nereus.emu.transfer import weight_sync_plan
    from nereus.runtime.execution.device import RankDevice
    from nereus.runtime.execution.torch_executor import TorchExecutor
    from nereus.runtime.worker.state import Counters, load_global

    cpu = RankDevice.cpu(rank, world)
    device = RankDevice(cpu.choice, cpu.placements, rank, dtype=torch.bfloat16)
    device.force_staging = True
    train = Emu("actor-train", "actor-train", Layout(1, 1), (0,))
    gen = Emu("actor-gen", "actor-gen", Layout(1, 1), (1,))
    ex = TorchExecutor(SPEC, rank, store, f"sync{run_id}", fields=1, timeout_s=60.0,
                       device=device)
    for emu in (train, gen):
        ex.create(emu, counters=Counters(), step=0.0)
        if emu in ex.units:
            load_global(ex.units[emu], global_state(3))
    out: dict[str, Any] = {}
    if train in ex.units:
        st = ex.units[train]
        before = {k: v.copy() for k, v in st.snapshot()["param"].items()}
        tokens = torch.randint(0, SPEC.vocab_size, (4, 12))
        loss = train_step(st, tokens[:, :-1], tokens[:, 1:], micro_batch=2)
        after = st.snapshot()["param"]
        out["loss"] = loss
        out["changed"] = sum(not np.array_equal(before[k], after[k]) for k in after)
        out["masters_fp32"] = all(st.master_of(p).dtype == torch.float32
                                  for p in st.model.parameters())
        out["grads_fp32"] = all(g.dtype == torch.float32 for g in st.grads())
        out["exp_avg_nonzero"] = any(bool(t.abs().sum() > 0)
                                     for t in st.tensors()["exp_avg"].values())
        out["param"] = after
    ex.weight_sync(weight_sync_plan(SPEC, (train,), (gen,), gpus_per_node=8))
    if gen in ex.units:
        st = ex.units[gen]
        out["param"] = st.snapshot()["param"]
        out["cast_ok"] = all(torch.equal(p.data, st.master_of(p).to(p.dtype))
                             for p in st.model.parameters())
    out["staged_bytes"] = ex.stats.get("staged_bytes", 0)
    return out


def test_mixed_precision_unit_trains_and_syncs(pool: Any) -> None:
    got = pool.run(_train_and_sync, next(RUN_IDS))
    r0, r1 = got[0], got[1]
    assert np.isfinite(r0["loss"]) and r0["changed"] > 0
    assert r0["masters_fp32"] and r0["grads_fp32"] and r0["exp_avg_nonzero"]
    assert r1["cast_ok"]
    for k, arr in r0["param"].items():  # fp32 masters arrive bit for bit through host buffers
        assert np.array_equal(r1["param"][k], arr), k
    assert r0["staged_bytes"] > 0 and r1["staged_bytes"] > 0
