"""The ``cluster:`` section: nodes, GPUs per node, a GPU preset and per-field hardware overrides.

Homogeneous: ``nodes: N`` with ``gpu`` and overrides at the section's level. Heterogeneous (per-node
hardware): ``nodes: [{count: 2, gpu: h200}, {count: 2, gpu: mi300x, memory_per_gpu_gb: 180}]``,
each group with its own preset and overrides (and ``name`` to tell apart two groups of one preset
with different overrides); every group has the section's ``gpus_per_node``. A group of CPU
virtual devices may play a vendor (``{count: 1, gpu: cpu, vendor: nvidia}``, named
``cpu-nvidia``): ``nereus run`` runs such a cluster on CPU ranks, two labels as two vendors. ``host_gbps``: the
host transport's bandwidth per GPU pair (between vendors), GB/s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nereus.config import fields as f
from nereus.config import limits
from nereus.errors import ConfigError
from nereus.spec.hardware import DEFAULT_HOST_GBPS, GPU_PRESETS, ClusterSpec, GpuSpec, NodeGroup

# YAML key → (GpuSpec field, factor from the YAML unit to the spec's unit).
GPU_OVERRIDES: dict[str, tuple[str, float]] = {
    "memory_per_gpu_gb": ("memory_bytes", 1e9),
    "peak_tflops": ("peak_flops", 1e12),
    "hbm_gbps": ("hbm_gbps", 1.0),
    "intra_node_gbps": ("intra_node_gbps", 1.0),
    "inter_node_gbps": ("inter_node_gbps", 1.0),
    "comm_setup_s": ("comm_setup_s", 1.0),
    "host_link_gbps": ("host_link_gbps", 1.0),
    "host_memory_per_gpu_gb": ("host_memory_bytes", 1e9),
}
CLUSTER_KEYS = ("nodes", "gpus_per_node", "gpu", "host_gbps", *GPU_OVERRIDES)
GROUP_KEYS = ("count", "gpu", "name", "gpus_per_node", "vendor", *GPU_OVERRIDES)
# ``vendor`` of a node group of CPU virtual devices: the vendor its ranks play (a heterogeneous
# job run on CPU ranks: pairs of different labels take the host transport, as between vendors).
CPU_LABELS = ("nvidia", "amd")
DEFAULT_NODES = 1
DEFAULT_GPUS_PER_NODE = 8


AUTO_GPU = "auto"  # cluster.gpu: auto — the hardware of the node the job starts on


def gpu_preset(path: str, value: Any, detected: GpuSpec | None = None) -> GpuSpec:
    """The preset ``value`` names; ``auto``: ``detected`` (the node's inventory, read by the
    shell), an error where nothing was detected."""
    if value == AUTO_GPU:
        if detected is None:
            raise ConfigError(path, value, "needs the node's inventory: use it with nereus run, "
                              "plan or config check, which read it")
        return detected
    if not isinstance(value, str) or value not in GPU_PRESETS:
        given = value if isinstance(value, str) else ""
        raise ConfigError(path, value, f.unknown_rule("GPU preset", given,
                                                      (*GPU_PRESETS, AUTO_GPU)))
    return GPU_PRESETS[value]


def uses_auto_gpu(data: Any) -> bool:
    """Whether a raw config document asks for ``cluster.gpu: auto``."""
    cluster = data.get("cluster") if isinstance(data, dict) else None
    return isinstance(cluster, dict) and cluster.get("gpu") == AUTO_GPU


def _overridden(path: str, raw: Any, gpu: GpuSpec) -> GpuSpec:
    """``gpu`` with the override fields of ``raw`` (at ``path``) applied."""
    changes: dict[str, Any] = {}
    for key, (spec_field, factor) in GPU_OVERRIDES.items():
        if key not in raw:
            continue
        at = f.join(path, key)
        if key == "comm_setup_s":
            changes[spec_field] = f.non_negative_float(at, raw[key])
        elif spec_field in ("memory_bytes", "host_memory_bytes"):
            memory_bytes = round(f.positive_float(at, raw[key], "MAX_MEMORY_GB") * factor)
            if memory_bytes < 1:
                raise ConfigError(at, raw[key], "must be at least one byte (1e-9 GB)")
            changes[spec_field] = memory_bytes
        else:
            changes[spec_field] = f.positive_float(at, raw[key]) * factor
    return replace(gpu, **changes) if changes else gpu


def _check_size(path: str, nodes: int, per_node: int) -> None:
    if nodes * per_node > limits.MAX_GPUS:
        raise ConfigError(path, nodes, f"nodes × gpus_per_node = {nodes * per_node:,} GPUs; "
                          f"at most {limits.named('MAX_GPUS', limits.MAX_GPUS)}")


def _missing_gpu(path: str) -> ConfigError:
    return ConfigError(path, None, f"missing; name a GPU preset: {', '.join(GPU_PRESETS)} (or auto)")


def _labelled(path: str, value: Any, gpu: GpuSpec) -> GpuSpec:
    """The CPU virtual device ``gpu`` playing vendor ``value`` (named ``cpu-<vendor>``)."""
    if gpu.vendor != "cpu":
        raise ConfigError(path, value, f"labels CPU virtual devices only (gpu: cpu); "
                          f"{gpu.name} is a {gpu.vendor} device")
    if value not in CPU_LABELS:
        raise ConfigError(path, value, f"must be one of {', '.join(CPU_LABELS)}")
    return replace(gpu, name=f"{gpu.name}-{value}", label=str(value))


def _node_groups(path: str, raw: Any, per_node: int) -> tuple[NodeGroup, ...]:
    """The node groups of ``cluster.nodes`` given as a list."""
    if not raw or not all(isinstance(item, dict) for item in raw):
        raise ConfigError(path, raw, "must be a positive integer or a non-empty list of node "
                          "groups {count, gpu, ...}")
    groups: list[NodeGroup] = []
    for i, item in enumerate(raw):
        at = f"{path}[{i}]"
        item = f.mapping(at, item, GROUP_KEYS)
        count = f.positive_int(f.join(at, "count"), item.get("count", 1), "MAX_GPUS")
        if "gpu" not in item:
            raise _missing_gpu(f.join(at, "gpu"))
        if item["gpu"] == AUTO_GPU:
            raise ConfigError(f.join(at, "gpu"), AUTO_GPU, "name a GPU preset in a node group "
                              "(auto reads the inventory of one node only)")
        if "gpus_per_node" in item:
            gpn = f.positive_int(f.join(at, "gpus_per_node"), item["gpus_per_node"])
            if gpn != per_node:
                raise ConfigError(f.join(at, "gpus_per_node"), gpn,
                                  f"every node group has the cluster's gpus_per_node ({per_node}): "
                                  "GPU ids are node·gpus_per_node + local index")
        gpu = _overridden(at, item, gpu_preset(f.join(at, "gpu"), item["gpu"]))
        if "vendor" in item:
            gpu = _labelled(f.join(at, "vendor"), item["vendor"], gpu)
        if "name" in item:
            gpu = replace(gpu, name=f.name(f.join(at, "name"), item["name"]))
        for j, g in enumerate(groups):
            if g.gpu.name == gpu.name and g.gpu != gpu:
                raise ConfigError(f.join(at, "gpu"), gpu.name,
                                  f"differs from {path}[{j}] of that name (other memory or links): "
                                  "give this group a name of its own")
        groups.append(NodeGroup(count, gpu))
    return tuple(groups)


def parse_cluster(raw: Any, path: str = "cluster", detected_gpu: GpuSpec | None = None
                  ) -> ClusterSpec:
    """A ClusterSpec; ``gpu`` is required, the override fields replace the preset's values."""
    raw = f.mapping(path, raw, CLUSTER_KEYS)
    per_node = f.positive_int(
        f.join(path, "gpus_per_node"), raw.get("gpus_per_node", DEFAULT_GPUS_PER_NODE),
        "MAX_GPUS_PER_NODE",
    )
    host_gbps = (f.positive_float(f.join(path, "host_gbps"), raw["host_gbps"])
                 if "host_gbps" in raw else DEFAULT_HOST_GBPS)
    nodes_raw = raw.get("nodes", DEFAULT_NODES)
    if isinstance(nodes_raw, list):
        groups = _node_groups(f.join(path, "nodes"), nodes_raw, per_node)
        for key in ("gpu", *GPU_OVERRIDES):
            if key in raw:
                raise ConfigError(f.join(path, key), raw[key],
                                  f"with node groups ({path}.nodes a list) set it per group")
        _check_size(f.join(path, "nodes"), sum(g.count for g in groups), per_node)
        return ClusterSpec.mixed(groups, per_node, host_gbps)
    nodes = f.positive_int(f.join(path, "nodes"), nodes_raw, "MAX_GPUS")
    _check_size(f.join(path, "nodes"), nodes, per_node)
    if "gpu" not in raw:
        raise _missing_gpu(f.join(path, "gpu"))
    gpu = gpu_preset(f.join(path, "gpu"), raw["gpu"], detected_gpu)
    return ClusterSpec(nodes=nodes, gpus_per_node=per_node, gpu=_overridden(path, raw, gpu),
                       host_gbps=host_gbps)
