"""Tier 1 (pure): CPU virtual devices labelled as vendors (``cluster.nodes[i].vendor``) — the
heterogeneous job ``nereus run`` executes on CPU ranks: parsing, one-line errors, the runtime's
cluster, per-pair links and transports, and the log's cross-vendor transport labels."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from nereus.cluster.transport import CROSS_VENDOR, HOST, RankPlacement, label, pair_transport
from nereus.config import parse_config
from nereus.config.run import parse_runtime
from nereus.errors import ConfigError
from nereus.transition.cost import transport_of

LABELLED: dict[str, Any] = {
    "job": {"algorithm": "grpo", "mode": "async", "global_batch": 4, "samples_per_prompt": 2,
            "minibatches": 2, "prompt_len": 8, "gen_len": 12, "reward_model": True},
    "models": {"actor": "tiny-gpt", "reference": "tiny-gpt", "reward": "tiny-gpt"},
    "cluster": {"gpus_per_node": 2, "nodes": [
        {"count": 1, "gpu": "cpu", "vendor": "nvidia", "memory_per_gpu_gb": 0.5},
        {"count": 1, "gpu": "cpu", "vendor": "amd", "memory_per_gpu_gb": 0.5}]},
}


def _setup(**group1: Any) -> Any:
    raw = copy.deepcopy(LABELLED)
    raw["cluster"]["nodes"][1].update(group1)
    return parse_config(raw).setup


def test_labels_make_two_hardware_types_of_the_cpu_device() -> None:
    cl = _setup().cluster
    assert cl.heterogeneous and [t.name for t in cl.types] == ["cpu-nvidia", "cpu-amd"]
    assert all(t.vendor == "cpu" for t in cl.types)  # still executed on the CPU
    assert [cl.gpu_of(g).plays for g in range(4)] == ["nvidia", "nvidia", "amd", "amd"]
    # between the labels: the host transport's link class, as between vendors
    assert cl.pair_gbps(1, 2) == cl.host_gbps and cl.pair_gbps(2, 3) == cl.gpu.intra_node_gbps
    assert not cl.same_transport(0, 2) and cl.same_transport(0, 1)
    assert transport_of(cl, 0, 2) == "host"
    # one label on every group is one type: the homogeneous spec
    assert not _setup(vendor="nvidia").cluster.heterogeneous


@pytest.mark.parametrize(("group", "field", "rule"), [
    ({"vendor": "intel"}, "cluster.nodes[1].vendor", "must be one of nvidia, amd"),
    ({"gpu": "h200", "vendor": "amd"}, "cluster.nodes[1].vendor",
     "labels CPU virtual devices only (gpu: cpu); h200 is a nvidia device"),
])
def test_label_errors_name_the_field(group: dict[str, Any], field: str, rule: str) -> None:
    with pytest.raises(ConfigError) as e:
        _setup(**group)
    assert e.value.field == field and rule in e.value.rule


def test_nereus_run_keeps_the_labelled_groups_and_each_ranks_memory() -> None:
    setup = _setup()
    rc, run = parse_runtime({"memory_per_rank_gb": 0.25}, setup)
    assert rc.ranks == 4 and run.cluster.heterogeneous
    assert [t.name for t in run.cluster.types] == ["cpu-nvidia", "cpu-amd"]
    assert {run.cluster.gpu_of(g).memory_bytes for g in range(4)} == {250_000_000}
    with pytest.raises(ConfigError) as e:
        parse_runtime({}, setup, ranks=2)
    assert e.value.field == "--ranks" and "one rank per GPU of every group: 4" in e.value.rule


def test_nereus_run_refuses_mixed_real_gpus_with_one_line() -> None:
    raw = copy.deepcopy(LABELLED)
    raw["cluster"] = {"gpus_per_node": 2, "nodes": [{"count": 1, "gpu": "h200"},
                                                    {"count": 1, "gpu": "mi300x"}]}
    with pytest.raises(ConfigError) as e:
        parse_runtime({}, parse_config(raw).setup)
    assert e.value.field == "cluster.nodes[0].gpu" and "labelled as vendors only" in e.value.rule


def test_cross_vendor_groups_are_host_and_labelled_so() -> None:
    p = tuple(RankPlacement(r, "n0", "cpu", v, "") for r, v in
              enumerate(("nvidia", "nvidia", "amd", "amd")))
    assert pair_transport(p[1], p[2]) == HOST
    assert label(HOST, p, [0, 1]) == "host:gloo"
    assert label(HOST, p, [1, 2]) == "host:gloo" + CROSS_VENDOR
    gpus = (RankPlacement(0, "a", "cuda", "nvidia", "nvidia:0"),
            RankPlacement(1, "b", "cuda", "amd", "amd:0"))
    assert pair_transport(*gpus) == HOST
    assert label(HOST, gpus, [0, 1]) == "host:gloo-staged" + CROSS_VENDOR


def test_a_capacity_drop_lowers_the_types_that_ran_out_only() -> None:
    cl = _setup().cluster
    low = cl.with_capacity((2,), 100_000_000)
    assert [low.gpu_of(g).memory_bytes for g in range(4)] == [500_000_000] * 2 + [100_000_000] * 2
    assert [t.name for t in low.types] == ["cpu-nvidia", "cpu-amd"]
    one = parse_config({**LABELLED, "cluster": {"nodes": 2, "gpus_per_node": 2, "gpu": "cpu"}})
    assert one.setup.cluster.with_capacity((3,), 7).gpu.memory_bytes == 7


def _gpu_ranks() -> tuple[RankPlacement, ...]:
    """The hetero run's layout (tests/mpi/test_hetero_run.py) on real GPUs: ranks 0 and 1 on
    NVIDIA GPUs of node a, ranks 2 and 3 on AMD GPUs of node b, one GPU each."""
    return (RankPlacement(0, "a", "cuda", "nvidia", "nvidia:0"),
            RankPlacement(1, "a", "cuda", "nvidia", "nvidia:1"),
            RankPlacement(2, "b", "cuda", "amd", "amd:0"),
            RankPlacement(3, "b", "cuda", "amd", "amd:1"))


def test_gpu_ranks_of_two_vendors_use_the_device_transport_within_a_vendor_and_host_across(
        ) -> None:
    """Every group of 2–4 of the ranks, through the chooser the runtime asks for every unit
    and transition group (``RankDevice``: ``group_transport``): NCCL within NVIDIA, RCCL within
    AMD, the staged host transport as soon as the group spans both vendors. (On CPU ranks every
    group is ``host`` whatever the labels: this is where the vendor rule decides.)"""
    import itertools

    from nereus.cluster.devices import cpu_choice
    from nereus.cluster.transport import DEVICE, group_transport
    from nereus.runtime.execution.device import RankDevice

    placed = _gpu_ranks()
    for a, b in itertools.combinations(placed, 2):
        assert pair_transport(a, b) == (DEVICE if a.vendor == b.vendor else HOST), (a, b)
    dev = RankDevice(cpu_choice("a test of the transport choice"), placed, 0)
    seen = set()
    for k in (2, 3, 4):
        for members in itertools.combinations(range(4), k):
            vendors = {placed[m].vendor for m in members}
            one = len(vendors) == 1
            assert group_transport(members, placed) == (DEVICE if one else HOST), members
            assert dev.backend(members) == ("nccl" if one else "gloo"), members
            assert dev.staged(members) == (not one), members
            want = ({"nvidia": "device:nccl", "amd": "device:rccl"}[vendors.pop()] if one
                    else "host:gloo-staged" + CROSS_VENDOR)
            assert dev.label(members) == want, members
            seen.add(want)
    assert seen == {"device:nccl", "device:rccl", "host:gloo-staged" + CROSS_VENDOR}
    # the same ranks as CPU ranks labelled as vendors (what tests/mpi runs): host everywhere
    cpu = tuple(RankPlacement(p.rank, p.node, "cpu", p.vendor, "") for p in placed)
    assert {group_transport(m, cpu) for m in ((0, 1), (2, 3), (1, 2))} == {HOST}
