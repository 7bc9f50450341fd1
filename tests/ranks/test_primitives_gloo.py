"""Split / Merge / Extend / Destroy over gloo on real Megatron GPTModels (4 ranks).

After every primitive of a hypothesis-generated sequence the global logical state (parameters,
Adam exp_avg / exp_avg_sq, step, counters) of every unit is reassembled from the ranks' shards
and compared bit for bit with the original.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.shard_cases import global_state

from nereus.emu.primitives import (
    Destroy,
    Extend,
    Merge,
    Split,
    consumed,
    extend_node,
    merge_node,
    produced,
    split_node,
)
from nereus.emu.shards import check_layout, shards_at, tensor_specs
from nereus.emu.unit import Emu, Layout
from nereus.errors import ConfigError
from nereus.spec.model import TINY_GPT

pytestmark = pytest.mark.slow
DEFAULT_DIRECT_MIN = 1 << 16  # nereus.runtime.execution.pack.DIRECT_MIN_VALUES (restored per run)
WORLD = 4
SPEC = TINY_GPT
COUNTERS = (7, 2, 5, 11)  # updates, model-stage version, policy version, position
STEP = 3.0


def _snapshot(ex: Any) -> dict[Emu, Any]:
    return {emu: (st.position, st.snapshot(), tuple(vars(st.counters).values()), st.step_value())
            for emu, st in ex.units.items()}


# How a transfer travels: "default" (tiny-gpt's slices are small: mostly packed; local copies
# ordered by the device's default: after the transfers on these CPU ranks), "direct" (every contiguous source slice its own
# message, non-contiguous destinations via a buffer; local copies while the transfers are in
# flight, as on a GPU), "allgather" (direct, and Split blocks as one gloo all-gather each).
MODES = ("default", "direct", "allgather")


def _run_sequence(rank: int, world: int, store: Any, initial: Emu, ops: list[Any],
                  seed: int, run_id: int, mode: str = "default") -> list[dict[Emu, Any]]:
    import nereus.runtime.execution.pack as rpack
    from nereus.runtime.execution.torch_executor import TorchExecutor
    from nereus.runtime.worker.state import Counters, load_global

    assert rpack.DIRECT_MIN_VALUES == DEFAULT_DIRECT_MIN
    if mode != "default":
        rpack.DIRECT_MIN_VALUES = 1
    try:
        ex = TorchExecutor(SPEC, rank, store, f"run{run_id}", timeout_s=30.0)
        ex.split_allgather = mode == "allgather"
        ex.overlap_local = None if mode == "default" else True  # None: the device decides
        ex.create(initial, counters=Counters(*COUNTERS), step=STEP)
        if initial in ex.units:
            load_global(ex.units[initial], global_state(seed))
        snaps = [_snapshot(ex)]
        live = {initial}
        for op in ops:
            if isinstance(op, Destroy):
                ex.destroy(op, live)  # refuses the last copy
            else:
                getattr(ex, type(op).__name__.lower())(op)
            live = (live - set(consumed(op))) | set(produced(op))
            snaps.append(_snapshot(ex))
    finally:
        rpack.DIRECT_MIN_VALUES = DEFAULT_DIRECT_MIN
    return snaps


def assemble(emu: Emu, per_rank: list[dict[Emu, Any]]) -> tuple[dict[str, Any], set[Any]]:
    """The global state of ``emu`` from its ranks' snapshots (NaN where no rank wrote)."""
    glob: dict[str, dict[str, np.ndarray]] = {
        f: {t.name: np.full(t.global_shape, np.nan, dtype=np.float32) for t in tensor_specs(SPEC)}
        for f in ("param", "exp_avg", "exp_avg_sq")}
    meta = set()
    for gpu in emu.gpus:
        (pp_rank, tp_rank), snap, counters, step = per_rank[gpu][emu]
        meta.add((counters, step))
        for s in shards_at(SPEC, emu.layout, pp_rank, tp_rank):
            for f, arrays in snap.items():
                local = arrays[s.local_key]
                for pc in s.pieces:
                    g = tuple(slice(a, b) for a, b in zip(pc.global_.start, pc.global_.stop,
                                                          strict=True))
                    lo = tuple(slice(a, b) for a, b in zip(pc.local.start, pc.local.stop,
                                                           strict=True))
                    if s.tp_replica:  # a replica must equal what tp rank 0 wrote
                        assert np.array_equal(glob[f][s.tensor][g], local[lo]) or np.isnan(
                            glob[f][s.tensor][g]).all()
                    glob[f][s.tensor][g] = local[lo]
    return glob, meta


LAYOUTS = [Layout(tp, pp) for tp in (1, 2) for pp in (1, 2, 4)]
RUN_IDS = itertools.count()


@st.composite
def sequences(draw: st.DrawFn) -> tuple[Emu, list[Any]]:
    """An initial unit and 3-4 primitives, simulated on the pure records (4 GPUs)."""
    lay = draw(st.sampled_from([lt for lt in LAYOUTS if lt.size <= WORLD]))
    units = [Emu("actor-train", "s", lay, tuple(range(lay.size)))]
    ops: list[Any] = []
    for _ in range(draw(st.integers(3, 4))):
        free = [g for g in range(WORLD) if all(g not in u.gpus for u in units)]
        options: list[Any] = []
        for u in units:
            for sub in LAYOUTS:
                if sub != u.layout and sub.divides(u.layout):
                    options.append(("split", u, sub))
            if len(free) >= u.layout.size:
                options.append(("extend", u, tuple(free[:u.layout.size])))
            if len(units) > 1:
                options.append(("destroy", u, None))
        for lt in LAYOUTS:
            for a in units:
                k = (lt.tp // a.layout.tp) * (lt.pp // a.layout.pp)
                same = [u for u in units if u.layout == a.layout]
                if a.layout.divides(lt) and lt != a.layout and k <= len(same) and lt.size <= WORLD:
                    try:
                        check_layout(SPEC, lt)
                    except ConfigError:
                        continue
                    options.append(("merge", tuple(same[:k]), lt))
        kind, a, b = draw(st.sampled_from(sorted(set(options), key=repr)))
        if kind == "split":
            op: Any = split_node(a, b)
            units = [u for u in units if u != a] + list(op.into)
        elif kind == "extend":
            op = extend_node(a, b)
            units = [*units, op.new]
        elif kind == "destroy":
            op = Destroy(a, 0)
            units = [u for u in units if u != a]
        else:
            op = merge_node(list(a), b)
            units = [u for u in units if u not in a] + [op.into]
        ops.append(op)
    return Emu("actor-train", "s", lay, tuple(range(lay.size))), ops


@pytest.fixture
def pool() -> Any:
    from support.gloo_harness import shared_pool

    return shared_pool(WORLD)


def _all_four() -> tuple[Emu, list[Any]]:
    """Extend (1,2) → 2 replicas, Merge into (2,2), Split into four (1,1), Destroy one."""
    a = Emu("actor-train", "s", Layout(1, 2), (0, 1))
    x = extend_node(a, (2, 3))
    m = merge_node([a, x.new], Layout(2, 2))
    s = split_node(m.into, Layout(1, 1))
    return a, [x, m, s, Destroy(s.into[0], 0)]


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@example(_all_four(), 1, "default")
@example(_all_four(), 2, "direct")
@example(_all_four(), 3, "allgather")
@given(sequences(), st.integers(0, 2**16), st.sampled_from(MODES))
def test_random_sequences_preserve_state_bit_for_bit(pool: Any, seq: tuple[Emu, list[Any]],
                                                      seed: int, mode: str) -> None:
    from nereus.emu.transfer import node_transfer

    initial, ops = seq
    per_step = pool.run(_run_sequence, initial, ops, seed, next(RUN_IDS), mode)
    want = global_state(seed)
    live = [initial]
    for i in range(len(ops) + 1):
        if i:
            op = ops[i - 1]
            live = [u for u in live if u not in consumed(op)] + list(produced(op))
            if isinstance(op, (Split, Extend)):
                plan = node_transfer(SPEC, op)
                assert plan.bytes_moved == plan.bytes_min
            elif isinstance(op, Merge):
                plan = node_transfer(SPEC, op)
                assert plan.bytes_moved == plan.bytes_min == 0
        snaps = [r[i] for r in per_step]
        held = {emu for s in snaps for emu in s}
        assert held == set(live), (i, held, live)
        for emu in live:
            got, meta = assemble(emu, snaps)
            assert meta == {(COUNTERS, STEP)}, (i, emu, meta)
            for f in want:
                for name, arr in want[f].items():
                    assert np.array_equal(got[f][name], arr), (i, emu, f, name)


# ---- one training step after Split / Merge vs a model built directly in the target layout ----


def _batch(seed: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, SPEC.vocab_size, (2, 16), generator=g)
    return tokens, torch.roll(tokens, -1, dims=1)


def _train_compare(rank: int, world: int, store: Any, run_id: int, seed: int) -> dict[str, Any]:
    import torch.distributed as dist
    from support.megatron_meta import load_via_megatron
    from support.unit_training import train_step

    from nereus.runtime.execution.torch_executor import TorchExecutor
    from nereus.runtime.worker.state import Counters, load_global

    ex = TorchExecutor(SPEC, rank, store, f"train{run_id}", timeout_s=30.0)
    glob = global_state(seed)
    first = Emu("actor-train", "s", Layout(2, 1), (0, 1))
    ex.create(first, counters=Counters(*COUNTERS), step=STEP)
    if first in ex.units:
        load_global(ex.units[first], glob)
    out: dict[str, Any] = {}
    # Split tp2 → two tp1 units; the direct tp1 model on GPU 2 is loaded through Megatron.
    s = split_node(first, Layout(1, 1))
    ex.split(s)
    direct1 = Emu("actor-train", "direct", Layout(1, 1), (2,))
    ex.create(direct1, counters=Counters(*COUNTERS), step=STEP)
    if direct1 in ex.units:
        load_via_megatron(ex.units[direct1], glob)
    tokens, labels = _batch(seed)
    for emu in (*s.into, direct1):
        if emu in ex.units:
            train_step(ex.units[emu], tokens, labels)
    out["after_split"] = _snapshot(ex)
    # Merge the two trained tp1 replicas → tp2; the direct tp2 model on GPUs 2,3 is loaded from
    # the same (trained) state, taken from the direct tp1 unit on GPU 2 (tp1·pp1 = whole model).
    m = merge_node(list(s.into), Layout(2, 1))
    ex.merge(m)
    box: list[Any] = [None]
    if rank == 2:
        snap = ex.units[direct1].snapshot()  # local keys are the logical names at tp1·pp1
        box[0] = snap
    dist.broadcast_object_list(box, src=2)
    trained = box[0]
    direct2 = Emu("actor-train", "direct2", Layout(2, 1), (2, 3))
    ex.create(direct2, counters=Counters(*COUNTERS), step=STEP + 1)
    if direct2 in ex.units:
        load_via_megatron(ex.units[direct2], trained)
    tokens, labels = _batch(seed + 1)
    for emu in (m.into, direct2, direct1):
        if emu in ex.units:
            train_step(ex.units[emu], tokens, labels)
    out["after_merge"] = _snapshot(ex)
    return out


def test_training_step_after_split_and_merge_matches_direct_build(pool: Any) -> None:
    res = pool.run(_train_compare, next(RUN_IDS), 5)
    # After Split: the tp1 unit on GPU 0 vs the direct tp1 model on GPU 2. Same layout ⇒ the same
    # kernels in the same reduction order ⇒ bit-identical (tolerance 0).
    split0 = Emu("actor-train", "s", Layout(1, 1), (0,))
    direct1 = Emu("actor-train", "direct", Layout(1, 1), (2,))
    got, want = res[0]["after_split"][split0][1], res[2]["after_split"][direct1][1]
    for f in want:
        for k in want[f]:
            assert np.array_equal(got[f][k], want[f][k]), ("split", f, k)
    # After Merge: the merged tp2 unit on GPUs 0,1 vs the direct tp2 model on GPUs 2,3, position
    # by position: bit-identical for the same reason.
    merged = Emu("actor-train", "s", Layout(2, 1), (0, 1))
    direct2 = Emu("actor-train", "direct2", Layout(2, 1), (2, 3))
    for gpu_m, gpu_d in ((0, 2), (1, 3)):
        got, want = res[gpu_m]["after_merge"][merged][1], res[gpu_d]["after_merge"][direct2][1]
        for f in want:
            for k in want[f]:
                assert np.array_equal(got[f][k], want[f][k]), ("merge", f, k)
    # Across layouts (tp2 merged vs tp1 direct, one more step) only the reduction order differs
    # (row-parallel partial sums all-reduced over tp, vocab-sharded logits): fp32 rounding of
    # ~1e-7 relative in the gradients, which Adam (lr 1e-3) turns into parameter differences
    # far below 1e-5. The tp1 copy of the logical state is compared with atol 1e-5.
    tp2, _ = assemble(merged, [r["after_merge"] for r in res])
    tp1 = res[2]["after_merge"][direct1][1]
    diffs = [float(np.max(np.abs(tp2["param"][k] - tp1["param"][k]))) for k in tp1["param"]]
    assert max(diffs) < 1e-5


# ---- per-step actor weight sync: actor-train (tp2) → actor-gen (two tp1 replicas) ----


def _weight_sync(rank: int, world: int, store: Any, run_id: int, seed: int) -> list[Any]:
    from support.unit_training import train_step

    from nereus.emu.transfer import weight_sync_plan
    from nereus.runtime.execution.torch_executor import TorchExecutor
    from nereus.runtime.worker.state import load_global

    ex = TorchExecutor(SPEC, rank, store, f"sync{run_id}", timeout_s=30.0)
    train = Emu("actor-train", "s", Layout(2, 1), (0, 1))
    gens = [Emu("actor-gen", "g", Layout(1, 1), (2,)), Emu("actor-gen", "g", Layout(1, 1), (3,))]
    for e in (train, *gens):
        ex.create(e)
    if train in ex.units:
        load_global(ex.units[train], global_state(seed))
    plan = weight_sync_plan(SPEC, [train], gens)
    snaps = []
    for step in range(2):
        if step and train in ex.units:
            train_step(ex.units[train], *_batch(seed + step))
        ex.weight_sync(plan)
        snaps.append(_snapshot(ex))
    return snaps


def test_weight_sync_train_to_gen_layout(pool: Any) -> None:
    from nereus.emu.transfer import weight_sync_plan

    train = Emu("actor-train", "s", Layout(2, 1), (0, 1))
    gens = [Emu("actor-gen", "g", Layout(1, 1), (2,)), Emu("actor-gen", "g", Layout(1, 1), (3,))]
    plan = weight_sync_plan(SPEC, [train], gens)
    assert plan.bytes_moved == plan.bytes_min > 0 and plan.fields == 1
    res = pool.run(_weight_sync, next(RUN_IDS), 9)
    for step in range(2):
        snaps = [r[step] for r in res]
        want, _ = assemble(train, snaps)
        for gen in gens:
            got = snaps[gen.gpus[0]][gen][1]
            for name in want["param"]:
                assert np.array_equal(got["param"][name], want["param"][name]), (step, name)
                assert not got["exp_avg"][name].any()  # gen units hold no optimizer state
    assert not np.array_equal(assemble(train, [r[0] for r in res])[0]["param"]["output_layer.weight"],
                              assemble(train, [r[1] for r in res])[0]["param"]["output_layer.weight"])


# ---- checkpoint/restart baseline: save one replica with torch DCP, load into other layouts ----


def _checkpoint_reshard(rank: int, world: int, store: Any, run_id: int, seed: int,
                        path: str) -> list[Any]:
    from nereus.runtime.execution.dcp_restart import load_units, save_units
    from nereus.runtime.execution.torch_executor import TorchExecutor
    from nereus.runtime.worker.state import Counters, load_global

    ex = TorchExecutor(SPEC, rank, store, f"ckpt{run_id}", timeout_s=30.0)
    source = Emu("actor-train", "s", Layout(2, 2), (0, 1, 2, 3))
    ex.create(source, counters=Counters(*COUNTERS), step=STEP)
    load_global(ex.units[source], global_state(seed))
    save_units(path, list(ex.units.values()), source)
    ex.units.clear()  # the job stops; below, the ranks come back in the new layouts
    targets = [Emu("actor-train", "s", Layout(1, 2), (0, 1)),
               Emu("actor-train", "s", Layout(1, 2), (2, 3)),
               Emu("actor-train", "s", Layout(2, 1), (3, 1))]
    for t in targets:
        ex.create(t)
    load_units(path, list(ex.units.values()))
    return [_snapshot(ex)]


def test_checkpoint_restart_reshards_bit_for_bit(pool: Any, tmp_path: Any) -> None:
    res = pool.run(_checkpoint_reshard, next(RUN_IDS), 4, str(tmp_path / "ckpt"))
    want = global_state(4)
    snaps = [r[0] for r in res]
    held = {e for s in snaps for e in s}
    assert len(held) == 3
    for emu in held:
        got, meta = assemble(emu, snaps)
        assert meta == {(COUNTERS, STEP)}
        for f in want:
            for name in want[f]:
                assert np.array_equal(got[f][name], want[f][name]), (emu, f, name)


# ---- a rank that hangs and dies during a primitive: survivors raise CommunicationError when
# the transition timeout expires (not when the peer's socket closes), sources intact ----

KILL_TIMEOUT_S = 5.0


def _killed_during_split(rank: int, world: int, store: Any, run_id: int, seed: int) -> Any:
    import os

    import nereus.runtime.execution.torch_executor as rp
    from nereus.errors import CommunicationError
    from nereus.runtime.worker.state import load_global

    ex = rp.TorchExecutor(SPEC, rank, store, f"kill{run_id}", timeout_s=KILL_TIMEOUT_S)
    source = Emu("actor-train", "s", Layout(2, 2), (0, 1, 2, 3))
    ex.create(source, step=STEP)
    load_global(ex.units[source], global_state(seed))
    real = rp.execute_plan

    def dying(*args: Any, **kwargs: Any) -> Any:
        if rank == world - 1:  # with the transfer group joined: hang past the timeout, then die
            time.sleep(KILL_TIMEOUT_S + 3.0)
            os._exit(1)
        return real(*args, **kwargs)

    rp.execute_plan = dying
    t0 = time.monotonic()
    try:
        ex.split(split_node(source, Layout(1, 1)))
        return ("no error", time.monotonic() - t0, None)
    except CommunicationError as e:
        return (str(e), time.monotonic() - t0, _snapshot(ex))
    finally:
        rp.execute_plan = real


def test_killed_rank_gives_communication_error_and_intact_sources(pool: Any) -> None:
    from support.gloo_harness import discard_pool

    try:
        res = pool.run(_killed_during_split, next(RUN_IDS), 3, dying=(WORLD - 1,))
    finally:
        discard_pool(WORLD)  # the dead rank is gone from the job's default group
    source = Emu("actor-train", "s", Layout(2, 2), (0, 1, 2, 3))
    want = global_state(3)
    for rank, r in enumerate(res[:-1]):
        msg, elapsed_s, snap = r
        assert msg != "no error" and f"rank {rank}" in msg, msg
        assert KILL_TIMEOUT_S - 1.0 < elapsed_s < KILL_TIMEOUT_S + 10.0, elapsed_s
        assert set(snap) == {source}  # no half-built unit installed; the source is kept
        (pp_rank, tp_rank), arrays, _, step = snap[source]
        assert step == STEP
        for s in shards_at(SPEC, source.layout, pp_rank, tp_rank):
            for f in arrays:
                for pc in s.pieces:
                    lo = tuple(slice(a, b) for a, b in zip(pc.local.start, pc.local.stop,
                                                           strict=True))
                    g = tuple(slice(a, b) for a, b in zip(pc.global_.start, pc.global_.stop,
                                                          strict=True))
                    assert np.array_equal(arrays[f][s.local_key][lo], want[f][s.tensor][g])
    assert res[-1] is None
