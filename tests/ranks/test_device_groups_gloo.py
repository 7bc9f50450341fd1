"""Device communicators created in one order agreed by every rank: no member waits forever.

torch names a group made with ``new_group(..., use_local_synchronization=True)`` by a hash of its
members and the number of groups *this* rank has registered; a rank registers only the groups it
is a member of, so after a unit group of [0, 1] the members 1 and 2 of a device communicator
[1, 2] disagree on its name and wait under different store prefixes until their timeout (what
3f4bc70's ``RankDevice.device_group`` did on every multi-GPU node). Since then every rank of the
job creates every device communicator, in the order the DAG (and the weight sync) reaches it —
torch's collective ``new_group`` — and the communicators are reused by member set.

NCCL cannot run on a CPU build of torch: the ranks carry placements on their own GPUs (so Nereus
asks for ``nccl`` groups as on a GPU node) and ``support.device_double.nccl_as_gloo`` hands those
groups to gloo — the vendor library is the only thing replaced; names, prefixes and order are
torch's own. Old code fails these tests by timeout (bounded: ``TIMEOUT_S``), not by a hang.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from support.dag_cases import SETUP, STAGES, compile_case
from support.device_double import gpu_placements, nccl_as_gloo
from support.shard_cases import global_state

from nereus.emu.unit import Emu, Layout
from nereus.transition.wire import dag_from_wire, dag_to_wire

TIMEOUT_S = 20.0  # a member that waits this long on a group's creation fails the test
COUNTERS = {"actor-train": (7, 2, 5, 11), "actor-gen": (3, 1, 4, 0)}
STEP = {"actor-train": 3.0, "actor-gen": 0.0}
RUN_IDS = itertools.count()


def _device(rank: int, world: int, shared: tuple[int, ...] = ()) -> Any:
    from nereus.cluster.devices import cpu_choice
    from nereus.runtime.execution.device import RankDevice

    # the tensors stay on the CPU (no GPU here); the placements make the transport ``device``
    return RankDevice(cpu_choice("test: CPU tensors, GPU placements"),
                      gpu_placements(world, shared), rank)


def _reduce(group: Any, rank: int) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=group)
    return float(t.item())


def _patterns(rank: int, world: int, store: Any) -> dict[str, Any]:
    """The issue's pattern, then more groups interleaved with collective unit groups; every rank
    calls ``device_group`` for every member set (non-members get None)."""
    from datetime import timedelta

    import torch.distributed as dist

    from nereus.errors import CommunicationError

    dist.barrier()  # every rank past its imports
    created: list[tuple[int, ...]] = []
    out: dict[str, Any] = {"sums": {}, "names": {}}
    with nccl_as_gloo(created):
        dev = _device(rank, world)
        to = timedelta(seconds=TIMEOUT_S)
        dist.new_group([0, 1], timeout=to, backend="gloo")  # a unit group (collective)
        for members in [(1, 2), (0, 2), (1, 2), (0, 1, 2), (0, 1)]:
            g = dev.device_group(members, TIMEOUT_S)
            assert (g is not None) == (rank in members), (members, g)
            if g is not None:
                out["sums"][members] = _reduce(g, rank)
                out["names"][members] = dist.distributed_c10d._get_process_group_name(g)
            dist.new_group([members[-1]], timeout=to, backend="gloo")  # another unit group
        again = dev.device_group((1, 2), TIMEOUT_S)
        out["cached"] = again is dev.device_group((1, 2), TIMEOUT_S)
        out["created"] = list(created)
        dev.abort()
        try:
            dev.device_group((0, 2), TIMEOUT_S)
        except CommunicationError as e:
            out["after_abort"] = str(e)
    return out


def test_member_only_communicator_after_a_unit_group_does_not_hang() -> None:
    from support.gloo_harness import shared_pool

    per_rank = shared_pool(3).run(_patterns, timeout_s=4 * TIMEOUT_S + 60)
    want = {(1, 2): 5.0, (0, 2): 4.0, (0, 1, 2): 6.0, (0, 1): 3.0}
    for rank, got in enumerate(per_rank):
        assert got["sums"] == {m: s for m, s in want.items() if rank in m}
        # one creation per member set, in the same order on every rank (members or not)
        assert got["created"] == [(1, 2), (0, 2), (0, 1, 2), (0, 1)]
        assert got["cached"]
        assert "aborted" in got["after_abort"]
    for members in want:
        names = {per_rank[r]["names"][members] for r in members}
        assert len(names) == 1, (members, names)  # the members agree on the group's name


# Real DAGs on 4 ranks whose transfer groups are subsets of the ranks (member-only), with every
# rank on its own GPU, and with ranks 2 and 3 sharing one (host groups between device groups).
_TP_CHANGE = ((Emu("actor-train", "actor-train", Layout(2, 1), (0, 1)),
               Emu("actor-train", "actor-train", Layout(2, 1), (2, 3)),
               Emu("actor-gen", "actor-gen", Layout(1, 1), (0,)),
               Emu("actor-gen", "actor-gen", Layout(1, 1), (1,))),
              (Emu("actor-train", "actor-train", Layout(2, 2), (0, 1, 2, 3)),
               Emu("actor-gen", "actor-gen", Layout(2, 2), (3, 2, 1, 0))))
_EXTEND_SPLIT = ((Emu("actor-train", "actor-train", Layout(2, 1), (1, 2)),
                  Emu("actor-gen", "actor-gen", Layout(1, 2), (0, 3))),
                 (Emu("actor-train", "actor-train", Layout(1, 1), (1,)),
                  Emu("actor-train", "actor-train", Layout(1, 1), (2,)),
                  Emu("actor-train", "actor-train", Layout(1, 1), (3,)),
                  Emu("actor-gen", "actor-gen", Layout(1, 1), (0,)),
                  Emu("actor-gen", "actor-gen", Layout(1, 1), (2,))))
CASES = {"tp-change": _TP_CHANGE, "extend-split": _EXTEND_SPLIT}


def _run_dag(rank: int, world: int, store: Any, wire: dict[str, Any], seeds: dict[str, int],
             shared: tuple[int, ...], run_id: int) -> dict[str, Any]:
    import torch.distributed as dist

    from nereus.runtime.execution.dag import run_dag
    from nereus.runtime.execution.groups import unit_groups
    from nereus.runtime.worker.state import Counters, load_global, new_unit_state
    from nereus.spec.model import TINY_GPT

    dag = dag_from_wire(wire)
    dist.barrier()  # every rank past its imports (a slow import is not a group's fault)
    with nccl_as_gloo():
        dev = _device(rank, world, shared)
        held = {}
        for emu in dag.source:  # every rank creates every unit's groups, in the same order
            groups = unit_groups(emu, rank, TIMEOUT_S, dev)
            if groups is None:
                continue
            s = new_unit_state(TINY_GPT, emu, rank, groups, step=STEP[emu.model_stage],
                               counters=Counters(*COUNTERS[emu.model_stage]), device=dev)
            load_global(s, global_state(seeds[emu.model_stage]))
            held[emu] = s
        final, _, run = run_dag(SETUP, dag, held, rank, store, f"devdag{run_id}",
                                timeout_s=TIMEOUT_S, lr=1e-3, device=dev)
        dev.destroy()
    return {"units": {emu: (s.position, s.snapshot(), tuple(vars(s.counters).values()),
                            s.step_value()) for emu, s in final.items()},
            "transports": dict(run.transports)}


def _assemble(emu: Emu, per_rank: list[dict[Emu, Any]]) -> tuple[dict[str, Any], set[Any]]:
    """The global state of ``emu`` from its ranks' shards, and the set of their metadata."""
    from nereus.emu.shards import shards_at, tensor_specs
    from nereus.spec.model import TINY_GPT

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


@pytest.mark.slow
@pytest.mark.parametrize("shared", [(), (2, 3)], ids=["own-gpus", "2-3-share-a-gpu"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_dag_with_member_only_device_groups_reaches_the_target(case: str,
                                                               shared: tuple[int, ...]) -> None:
    from support.gloo_harness import shared_pool

    src, tgt = CASES[case]
    dag = compile_case(src, tgt)
    seeds = {"actor-train": 11, "actor-gen": 12}
    per_rank = shared_pool(4).run(_run_dag, dag_to_wire(dag), seeds, shared, next(RUN_IDS),
                                  timeout_s=6 * TIMEOUT_S + 120)
    units = [r["units"] for r in per_rank]
    assert {emu for r in units for emu in r} == set(tgt)
    for emu in tgt:
        got, meta = _assemble(emu, units)
        ms = emu.model_stage
        assert meta == {(COUNTERS[ms], STEP[ms])}, (emu, meta)
        want = global_state(seeds[ms])
        for f in (("param", "exp_avg", "exp_avg_sq") if STAGES[ms] else ("param",)):
            for name, arr in want[f].items():
                assert np.array_equal(got[f][name], arr), (emu, f, name)
    used = {k for r in per_rank for k in r["transports"]}
    if shared:  # a group with both of 2 and 3 goes over the host (staged), the others not
        assert "host:gloo-staged" in used, used
    else:
        assert used == {"device:nccl"}, used  # the device transport carried every transfer
