"""A host-staged transition executed on 8 gloo ranks holding real Megatron GPTModels.

The case (tests/support/staged_cases.py) is shaped like issue 32's: the target is faster, and
every order of its plain DAG exceeds device memory. The planner stages actor-train through host
memory (:func:`nereus.transition.change.plan_change`); the planned transition travels in its
wire form, every rank runs it (:func:`nereus.runtime.execution.host_stage.run_staged`), and every
target unit's global state is reassembled from the ranks and compared bit for bit with the state
of a job that did not transition (the source state, counters and Adam steps), and with the same
change run as a plain DAG on ranks with unbounded memory.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from support.shard_cases import global_state
from support.staged_cases import CAPACITY, CURRENT, ROOMY, SETUP, STAGES, TARGET, WORLD

from nereus.emu.shards import shards_at, tensor_specs
from nereus.emu.unit import Emu, emus_of_plan
from nereus.spec.model import TINY_GPT
from nereus.transition.change import plan_change
from nereus.transition.planned import plan_transition, stage_states
from nereus.transition.staged import staged_device_peaks
from nereus.transition.wire import dag_from_wire, dag_to_wire, staged_from_wire, staged_to_wire

COUNTERS = {"actor-train": (7, 2, 5, 11), "actor-gen": (3, 1, 4, 0)}
STEP = {"actor-train": 3.0, "actor-gen": 0.0}
SEEDS = {"actor-train": 17, "actor-gen": 18}
RUN_IDS = itertools.count()


def _held(rank: int) -> dict[Emu, Any]:
    from nereus.runtime.execution.groups import unit_groups
    from nereus.runtime.worker.state import Counters, load_global, new_unit_state

    held = {}
    for emu in emus_of_plan(CURRENT, stage_states(SETUP)):  # every rank, the same order
        groups = unit_groups(emu, rank, 30.0)
        if groups is None:
            continue
        s = new_unit_state(TINY_GPT, emu, rank, groups, step=STEP[emu.model_stage],
                           counters=Counters(*COUNTERS[emu.model_stage]))
        load_global(s, global_state(SEEDS[emu.model_stage]))
        held[emu] = s
    return held


def _snap(final: dict[Emu, Any]) -> dict[Emu, Any]:
    return {emu: (s.position, s.snapshot(), tuple(vars(s.counters).values()), s.step_value())
            for emu, s in final.items()}


def _run_staged(rank: int, world: int, store: Any, wire: dict[str, Any], run_id: int
                ) -> tuple[dict[Emu, Any], int, int]:
    from nereus.runtime.execution.host_stage import run_staged

    staged = staged_from_wire(wire)
    final, _, run = run_staged(SETUP, staged, _held(rank), rank, store, f"staged{run_id}",
                               timeout_s=30.0, lr=1e-3)
    return _snap(final), run.host_bytes, run.reload_bytes


def _run_plain(rank: int, world: int, store: Any, wire: dict[str, Any], run_id: int
               ) -> dict[Emu, Any]:
    from nereus.runtime.execution.dag import run_dag

    final, _, _ = run_dag(ROOMY, dag_from_wire(wire), _held(rank), rank, store,
                          f"plain{run_id}", timeout_s=30.0, lr=1e-3)
    return _snap(final)


def assemble(emu: Emu, per_rank: list[dict[Emu, Any]]) -> tuple[dict[str, Any], set[Any]]:
    glob = {f: {t.name: np.full(t.global_shape, np.nan, dtype=np.float32)
                for t in tensor_specs(TINY_GPT)} for f in ("param", "exp_avg", "exp_avg_sq")}
    meta = set()
    for gpu in emu.gpus:
        (pp_rank, tp_rank), snap, counters, step = per_rank[gpu][emu]
        meta.add((counters, step))
        for s in shards_at(TINY_GPT, emu.layout, pp_rank, tp_rank):
            for f, arrays in snap.items():
                for pc in s.pieces:
                    g = tuple(slice(a, b) for a, b in zip(pc.global_.start, pc.global_.stop,
                                                          strict=True))
                    lo = tuple(slice(a, b) for a, b in zip(pc.local.start, pc.local.stop,
                                                           strict=True))
                    glob[f][s.tensor][g] = arrays[s.local_key][lo]
    return glob, meta


@pytest.fixture
def pool() -> Any:
    from support.gloo_harness import shared_pool

    return shared_pool(WORLD)


def test_staged_change_on_8_ranks_is_bit_exact(pool: Any) -> None:
    planned = plan_change(SETUP, CURRENT, TARGET)
    assert planned.executor == "staged" and planned.staged is not None
    peaks = staged_device_peaks(planned, CAPACITY)
    assert max(peaks.values()) <= CAPACITY  # every leg fits, as planned
    # 8 ranks spawned on a shared 2-core machine: a generous limit
    out = pool.run(_run_staged, staged_to_wire(planned.staged), next(RUN_IDS), timeout_s=600.0)
    per_rank = [o[0] for o in out]
    tgt = set(emus_of_plan(TARGET, stage_states(SETUP)))
    assert {emu for r in per_rank for emu in r} == tgt
    for emu in tgt:
        got, meta = assemble(emu, per_rank)
        ms = emu.model_stage
        assert meta == {(COUNTERS[ms], STEP[ms])}, (emu, meta)
        want = global_state(SEEDS[ms])
        for f in (("param", "exp_avg", "exp_avg_sq") if STAGES[ms] else ("param",)):
            for name, arr in want[f].items():
                assert np.array_equal(got[f][name], arr), (emu, f, name)
    # the source replica's 4 positions parked their shards; every rank saw the same reload
    parked = [o[1] for o in out]
    source = planned.staged.stages[0].source
    assert all((b > 0) == (r in source.gpus) for r, b in enumerate(parked))
    assert len({o[2] for o in out}) == 1 and out[0][2] > 0

    # the same change as a plain DAG on ranks with room for it: the same units, bit for bit
    roomy = plan_transition(ROOMY, CURRENT, TARGET)
    plain = pool.run(_run_plain, dag_to_wire(roomy.dag), next(RUN_IDS), timeout_s=600.0)
    for r in range(WORLD):
        assert plain[r].keys() == per_rank[r].keys()
        for emu, (pos, snap, counters, step) in plain[r].items():
            pos2, snap2, counters2, step2 = per_rank[r][emu]
            assert (pos, counters, step) == (pos2, counters2, step2)
            for f, arrays in snap.items():
                for k, a in arrays.items():
                    assert np.array_equal(a, snap2[f][k]), (r, emu, f, k)
