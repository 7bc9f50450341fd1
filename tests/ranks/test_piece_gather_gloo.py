"""The vLLM weight refresh's gather over a unit's tp group, as plain tensors, on 2 gloo ranks:
``unit_params`` of a real tp=2 Megatron unit returns exactly the global parameters loaded into
it, and uneven contributions (one rank sends nothing) arrive whole on every rank."""

from __future__ import annotations

from typing import Any

import numpy as np

from nereus.emu.shards import tensor_specs
from nereus.spec.model import TINY_GPT


def _glob(seed: int) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {f: {t.name: rng.standard_normal(t.global_shape).astype(np.float32)
                for t in tensor_specs(TINY_GPT)} for f in ("param", "exp_avg", "exp_avg_sq")}


def _unit_params(rank: int, world: int, store: Any, seed: int) -> dict[str, np.ndarray] | None:
    from nereus.emu.unit import Emu, Layout
    from nereus.runtime.execution.groups import unit_groups
    from nereus.runtime.worker.gen_engines import unit_params
    from nereus.runtime.worker.state import load_global, new_unit_state

    emu = Emu("actor-gen", "actor-gen", Layout(2, 1), (0, 1))
    groups = unit_groups(emu, rank, 30.0)
    assert groups is not None
    st = new_unit_state(TINY_GPT, emu, rank, groups, seed=seed)
    load_global(st, _glob(seed))
    return unit_params(st)


def _uneven(rank: int, world: int, store: Any) -> list[Any]:
    import torch
    import torch.distributed as dist

    from nereus.runtime.worker.piece_gather import all_gather_pieces

    shapes = {"a": (3, 4), "b": (5,)}
    mine = [] if rank == 1 else [
        ("param", "a", (1, 0), (3, 4), np.arange(8, dtype=np.float32).reshape(2, 4)),
        ("param", "b", (0,), (5,), np.arange(5, dtype=np.int64))]
    got = all_gather_pieces(mine, dist.group.WORLD, torch.device("cpu"), shapes)
    return [[(f, n, a, b, arr.dtype.name, arr.tolist()) for f, n, a, b, arr in part]
            for part in got]


def test_unit_params_gathers_a_tp2_unit_exactly() -> None:
    from support.gloo_harness import shared_pool

    pool = shared_pool(2)
    seed = 11
    got = pool.run(_unit_params, seed)
    want = _glob(seed)["param"]
    for params in got:
        assert params is not None and set(params) == set(want)
        for name, arr in want.items():
            assert params[name].shape == arr.shape, name
            np.testing.assert_array_equal(params[name], arr, err_msg=name)

    parts = pool.run(_uneven)
    assert parts[0] == parts[1]
    assert parts[0][1] == []  # rank 1 sent nothing
    assert parts[0][0] == [
        ("param", "a", (1, 0), (3, 4), "float32", np.arange(8.0).reshape(2, 4).tolist()),
        ("param", "b", (0,), (5,), "int64", list(range(5)))]
