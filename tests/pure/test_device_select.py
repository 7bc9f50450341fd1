"""Device selection and transport choice (nereus.cluster.devices, nereus.cluster.transport):
pure functions of the job environment and the node's inventory, for NVIDIA, AMD, CPU and mixed
nodes."""

from __future__ import annotations

import pytest

from nereus.cluster.devices import (
    DetectedDevice,
    DeviceFacts,
    gpu_from_inventory,
    select_device,
    visible_list,
)
from nereus.cluster.transport import (
    DEVICE,
    HOST,
    RankPlacement,
    cpu_placements,
    default_backend,
    group_transport,
    label,
    pair_transport,
    staged,
)
from nereus.errors import ConfigError

NV8 = DeviceFacts("cuda", 8, ("nvidia",), local_rank=5, local_world_size=8)


def test_nvidia_rank_takes_its_local_rank() -> None:
    c = select_device("auto", NV8, "nvidia")
    assert (c.kind, c.vendor, c.index, c.device_id, c.shared) == ("cuda", "nvidia", 5,
                                                                  "nvidia:5", False)
    assert c.torch_device == "cuda:5"


def test_nvidia_visible_list_maps_to_physical_devices() -> None:
    facts = DeviceFacts("cuda", 2, ("nvidia",), local_rank=1, local_world_size=2,
                        cuda_visible_devices="6,7")
    c = select_device("cuda", facts, "nvidia")
    assert (c.index, c.device_id) == (1, "nvidia:7")
    assert "CUDA_VISIBLE_DEVICES=6,7" in c.reason


def test_amd_rocm_build_answers_as_cuda() -> None:
    facts = DeviceFacts("hip", 8, ("amd",), local_rank=3, local_world_size=8,
                        rocr_visible_devices="0,1,2,3,4,5,6,7")
    c = select_device("auto", facts, "amd")
    assert (c.kind, c.vendor, c.index, c.device_id) == ("cuda", "amd", 3, "amd:3")


def test_cpu_config_stays_on_cpu_on_a_gpu_node() -> None:
    c = select_device("auto", NV8, "cpu")
    assert c.kind == "cpu" and "CPU virtual device" in c.reason


def test_explicit_cpu_wins() -> None:
    assert select_device("cpu", NV8, "nvidia").kind == "cpu"


def test_auto_falls_back_to_cpu_with_the_reason() -> None:
    c = select_device("auto", DeviceFacts("cpu", 0), "nvidia")
    assert c.kind == "cpu" and "CPU build" in c.reason
    c = select_device("auto", DeviceFacts("cuda", 8, ("nvidia",), cuda_visible_devices=""),
                      "nvidia")
    assert c.kind == "cpu" and "hides every device" in c.reason


def test_cuda_without_a_gpu_is_one_line_naming_the_field() -> None:
    with pytest.raises(ConfigError) as e:
        select_device("cuda", DeviceFacts("cuda", 0, ()), "nvidia")
    assert e.value.field == "runtime.device" and "sees no nvidia device" in str(e.value)
    with pytest.raises(ConfigError):
        select_device("gpu", NV8, "nvidia")


def test_vendor_mismatch_with_the_config_is_an_error() -> None:
    with pytest.raises(ConfigError) as e:
        select_device("auto", NV8, "amd")
    assert "cluster.gpu: auto" in e.value.rule


def test_mixed_node_uses_the_vendor_torch_drives() -> None:
    both = ("amd", "nvidia")
    c = select_device("auto", DeviceFacts("cuda", 4, both, local_rank=2, local_world_size=4),
                      "nvidia")
    assert (c.vendor, c.index) == ("nvidia", 2)
    c = select_device("auto", DeviceFacts("hip", 4, both, local_rank=1, local_world_size=4),
                      "amd")
    assert (c.vendor, c.index) == ("amd", 1)
    c = select_device("auto", DeviceFacts("hip", 0, ("nvidia",)), "amd")
    assert c.kind == "cpu" and "sees no amd device" in c.reason


def test_more_ranks_than_devices_share() -> None:
    facts = DeviceFacts("cuda", 1, ("nvidia",), local_rank=3, local_world_size=4)
    c = select_device("cuda", facts, "nvidia")
    assert (c.index, c.device_id, c.shared) == (0, "nvidia:0", True)


def test_visible_lists() -> None:
    assert visible_list(None) is None
    assert visible_list("") == () and visible_list("-1") == ()
    assert visible_list("0, 2,GPU-abc") == ("0", "2", "GPU-abc")


def _placed(kinds: list[tuple[str, str, str, str]]) -> tuple[RankPlacement, ...]:
    return tuple(RankPlacement(r, node, kind, vendor, dev)
                 for r, (node, kind, vendor, dev) in enumerate(kinds))


def test_transport_choices() -> None:
    p = _placed([("n0", "cuda", "nvidia", "nvidia:0"), ("n0", "cuda", "nvidia", "nvidia:1"),
                 ("n1", "cuda", "nvidia", "nvidia:0"), ("n1", "cuda", "amd", "amd:0"),
                 ("n0", "cuda", "nvidia", "nvidia:1"), ("n0", "cpu", "cpu", "")])
    assert pair_transport(p[0], p[1]) == DEVICE
    assert pair_transport(p[0], p[2]) == DEVICE  # device 0 on another node: its own GPU
    assert pair_transport(p[2], p[3]) == HOST  # NCCL and RCCL cannot talk
    assert pair_transport(p[1], p[4]) == HOST  # two ranks on one GPU
    assert pair_transport(p[0], p[5]) == HOST  # a CPU rank
    assert group_transport([0, 1, 2], p) == DEVICE
    assert group_transport([0, 1, 4], p) == HOST
    assert group_transport([4], p) == DEVICE and group_transport([5], p) == HOST
    assert staged([0, 1, 4], p) and not staged([5], p) and not staged([0, 1], p)
    assert label(DEVICE, p, [0, 1]) == "device:nccl"
    assert label(HOST, p, [1, 4]) == "host:gloo-staged"
    assert label(HOST, p, [5]) == "host:gloo"
    amd = _placed([("n0", "cuda", "amd", "amd:0"), ("n0", "cuda", "amd", "amd:1")])
    assert label(group_transport([0, 1], amd), amd, [0, 1]) == "device:rccl"


def test_default_backend() -> None:
    assert default_backend(cpu_placements(4)) == "gloo"
    one_gpu_each = _placed([("n0", "cuda", "nvidia", f"nvidia:{i}") for i in range(4)])
    assert default_backend(one_gpu_each) == "cpu:gloo,cuda:nccl"
    sharing = _placed([("n0", "cuda", "nvidia", "nvidia:0")] * 4)
    assert default_backend(sharing) == "gloo"
    assert default_backend(one_gpu_each[:1]) == "cpu:gloo,cuda:nccl"


def test_placements_round_trip() -> None:
    p = RankPlacement(3, "gpu01", "cuda", "amd", "amd:3")
    assert RankPlacement.from_dict(p.to_dict()) == p


def test_cluster_gpu_auto_from_inventory() -> None:
    h200 = DetectedDevice("nvidia", "NVIDIA H200", 150_754_820_096)
    g = gpu_from_inventory((h200, h200))
    assert (g.name, g.vendor, g.memory_bytes) == ("h200", "nvidia", 150_754_820_096)
    g = gpu_from_inventory((DetectedDevice("nvidia", "NVIDIA A100-SXM4-40GB", 40 * 10**9),))
    assert (g.name, g.memory_bytes) == ("a100-64gb", 40 * 10**9)
    g = gpu_from_inventory((DetectedDevice("amd", "AMD Instinct MI250X", 68_702_699_520),))
    assert (g.name, g.vendor) == ("mi250x-gcd", "amd")
    g = gpu_from_inventory((DetectedDevice("nvidia", "NVIDIA H100 80GB HBM3", 80 * 10**9),))
    assert (g.name, g.vendor, g.memory_bytes) == ("nvidia-h100-80gb-hbm3", "nvidia", 80 * 10**9)
    assert gpu_from_inventory(()).vendor == "cpu"
    mixed = (DetectedDevice("amd", "AMD Instinct MI250X", 64 * 10**9), h200)
    assert gpu_from_inventory(mixed, build_vendor="nvidia").name == "h200"
    assert gpu_from_inventory(mixed).name == "mi250x-gcd"
