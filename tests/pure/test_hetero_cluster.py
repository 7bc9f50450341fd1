"""Tier 1 (pure): per-node hardware — mixed clusters from YAML, their GPU → hardware map, links."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from nereus.config import parse_config
from nereus.errors import ConfigError
from nereus.spec.hardware import DEFAULT_HOST_GBPS, H200, MI300X, ClusterSpec, NodeGroup

BASE: dict[str, Any] = {
    "job": {"algorithm": "grpo", "global_batch": 64, "prompt_len": 512, "gen_len": 1024,
            "samples_per_prompt": 4, "reward_model": False},
    "models": {"actor": "llama-3.1-8b"},
    "cluster": {"gpus_per_node": 8, "nodes": [{"count": 2, "gpu": "h200"},
                                              {"count": 1, "gpu": "mi300x"}]},
}


def _cluster(**cluster: Any) -> ClusterSpec:
    raw = copy.deepcopy(BASE)
    raw["cluster"] = cluster
    return parse_config(raw).setup.cluster


def test_node_groups_give_each_node_its_hardware() -> None:
    c = parse_config(BASE).setup.cluster
    assert c.heterogeneous and c.nodes == 3 and c.num_gpus == 24
    assert c.types == (H200, MI300X)
    assert [c.node_gpu(n).name for n in range(3)] == ["h200", "h200", "mi300x"]
    assert c.gpu_of(15) == H200 and c.gpu_of(16) == MI300X
    assert c.gpus_of(MI300X) == tuple(range(16, 24))
    assert c.gpus_of(H200) == tuple(range(16))
    assert c.typed(MI300X).gpu == MI300X and not c.typed(MI300X).heterogeneous
    assert c.host_gbps == DEFAULT_HOST_GBPS


def test_links_per_pair_inside_a_node_between_nodes_and_between_vendors() -> None:
    c = ClusterSpec.mixed((NodeGroup(2, H200), NodeGroup(1, MI300X)), 8, host_gbps=10.0)
    assert c.pair_gbps(0, 1) == H200.intra_node_gbps
    assert c.pair_gbps(0, 8) == H200.inter_node_gbps  # two NVIDIA nodes: device transport
    assert c.pair_gbps(16, 17) == MI300X.intra_node_gbps
    assert c.pair_gbps(0, 16) == 10.0 and c.pair_gbps(16, 0) == 10.0  # NVIDIA ↔ AMD: host
    assert c.same_transport(0, 8) and not c.same_transport(0, 16)


def test_one_type_in_groups_is_the_homogeneous_spec() -> None:
    got = _cluster(gpus_per_node=8, nodes=[{"count": 1, "gpu": "h200"}, {"count": 3, "gpu": "h200"}])
    assert got == ClusterSpec(4, 8, H200)
    assert got == _cluster(gpus_per_node=8, nodes=4, gpu="h200")


def test_group_overrides_and_names() -> None:
    c = _cluster(gpus_per_node=4, host_gbps=25, nodes=[
        {"count": 1, "gpu": "h200"},
        {"count": 1, "gpu": "h200", "name": "h200-nvl", "memory_per_gpu_gb": 100,
         "inter_node_gbps": 25}])
    assert [t.name for t in c.types] == ["h200", "h200-nvl"]
    assert c.types[1].memory_bytes == 100 * 10**9 and c.types[1].inter_node_gbps == 25
    assert c.pair_gbps(0, 4) == 25 and c.host_gbps == 25


@pytest.mark.parametrize("cluster,field,rule", [
    ({"nodes": []}, "cluster.nodes", "non-empty list"),
    ({"nodes": [{"count": 0, "gpu": "h200"}]}, "cluster.nodes[0].count", "positive"),
    ({"nodes": [{"count": 1}]}, "cluster.nodes[0].gpu", "missing"),
    ({"nodes": [{"count": 1, "gpu": "auto"}]}, "cluster.nodes[0].gpu", "name a GPU preset"),
    ({"nodes": [{"count": 1, "gpu": "b200"}]}, "cluster.nodes[0].gpu", "unknown GPU preset"),
    ({"nodes": [{"count": 1, "gpu": "h200", "gpus": 2}]}, "cluster.nodes[0].gpus", "unknown key"),
    ({"nodes": [{"count": 1, "gpu": "h200", "gpus_per_node": 4}]},
     "cluster.nodes[0].gpus_per_node", "every node group has the cluster's gpus_per_node (8)"),
    ({"nodes": [{"count": 1, "gpu": "h200"},
                {"count": 1, "gpu": "h200", "memory_per_gpu_gb": 80}]},
     "cluster.nodes[1].gpu", "name of its own"),
    ({"nodes": [{"count": 1, "gpu": "h200"}], "gpu": "h200"}, "cluster.gpu", "per group"),
    ({"nodes": [{"count": 1, "gpu": "h200"}], "memory_per_gpu_gb": 9},
     "cluster.memory_per_gpu_gb", "per group"),
    ({"nodes": [{"count": 1, "gpu": "h200", "peak_tflops": -1}]},
     "cluster.nodes[0].peak_tflops", "positive"),
    ({"nodes": 2, "gpu": "h200", "host_gbps": 0}, "cluster.host_gbps", "positive"),
    ({"nodes": ["h200"]}, "cluster.nodes", "non-empty list of node groups"),
    ({"nodes": [8], "gpu": "h200"}, "cluster.nodes", "non-empty list of node groups"),
])
def test_bad_node_groups_name_field_value_and_rule(cluster: dict[str, Any], field: str,
                                                   rule: str) -> None:
    with pytest.raises(ConfigError) as e:
        _cluster(gpus_per_node=8, **cluster)
    assert e.value.field == field and rule in e.value.rule


def test_cli_error_is_one_line_exit_2(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from nereus.cli import main

    path = tmp_path / "job.yaml"
    path.write_text("job: {algorithm: grpo, global_batch: 8, prompt_len: 8, gen_len: 8}\n"
                    "models: {actor: llama-3.1-8b}\n"
                    "cluster: {nodes: [{count: 1, gpu: h200, gpus_per_node: 4}]}\n")
    code = main(["config", "check", str(path)])
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    assert out.err.strip().splitlines() == [
        "nereus: error: cluster.nodes[0].gpus_per_node=4: every node group has the cluster's "
        "gpus_per_node (8): GPU ids are node·gpus_per_node + local index"]


def test_cluster_from_the_hardware_gathered_per_node() -> None:
    from nereus.cluster.devices import DetectedDevice, gpu_from_inventory

    # what each node's inventory says (NVML / ROCm SMI), in node order
    nodes = (gpu_from_inventory((DetectedDevice("nvidia", "NVIDIA H200", 141 * 10**9),)),
             gpu_from_inventory((DetectedDevice("nvidia", "NVIDIA H200", 141 * 10**9),)),
             gpu_from_inventory((DetectedDevice("amd", "AMD Instinct MI250X", 64 * 10**9),)))
    c = ClusterSpec.of_nodes(nodes, 8)
    assert c.heterogeneous and c.nodes == 3
    assert [(g.count, g.gpu.name, g.gpu.vendor) for g in c.groups] == [
        (2, "h200", "nvidia"), (1, "mi250x-gcd", "amd")]
    assert ClusterSpec.of_nodes(nodes[:2], 8) == ClusterSpec(2, 8, nodes[0])
    # interleaved kinds stay in node order: GPU ids are node·gpus_per_node + local
    mixed = ClusterSpec.of_nodes((H200, MI300X, H200), 4)
    assert [g.count for g in mixed.groups] == [1, 1, 1]
    assert mixed.gpus_of(H200) == (0, 1, 2, 3, 8, 9, 10, 11)
