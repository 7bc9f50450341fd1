"""The ``cluster:`` section: nodes, GPUs per node, a GPU preset and per-field hardware overrides."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nereus.config import fields as f
from nereus.config import limits
from nereus.errors import ConfigError
from nereus.spec.hardware import GPU_PRESETS, ClusterSpec, GpuSpec

# YAML key → (GpuSpec field, factor from the YAML unit to the spec's unit).
GPU_OVERRIDES: dict[str, tuple[str, float]] = {
    "memory_per_gpu_gb": ("memory_bytes", 1e9),
    "peak_tflops": ("peak_flops", 1e12),
    "hbm_gbps": ("hbm_gbps", 1.0),
    "intra_node_gbps": ("intra_node_gbps", 1.0),
    "inter_node_gbps": ("inter_node_gbps", 1.0),
    "comm_setup_s": ("comm_setup_s", 1.0),
}
CLUSTER_KEYS = ("nodes", "gpus_per_node", "gpu", *GPU_OVERRIDES)
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


def parse_cluster(raw: Any, path: str = "cluster", detected_gpu: GpuSpec | None = None
                  ) -> ClusterSpec:
    """A ClusterSpec; ``gpu`` is required, the override fields replace the preset's values."""
    raw = f.mapping(path, raw, CLUSTER_KEYS)
    nodes = f.positive_int(f.join(path, "nodes"), raw.get("nodes", DEFAULT_NODES), "MAX_GPUS")
    per_node = f.positive_int(
        f.join(path, "gpus_per_node"), raw.get("gpus_per_node", DEFAULT_GPUS_PER_NODE),
        "MAX_GPUS_PER_NODE",
    )
    if nodes * per_node > limits.MAX_GPUS:
        raise ConfigError(
            f.join(path, "nodes"), nodes, f"nodes × gpus_per_node = {nodes * per_node:,} GPUs; "
            f"at most {limits.named('MAX_GPUS', limits.MAX_GPUS)}",
        )
    if "gpu" not in raw:
        raise ConfigError(
            f.join(path, "gpu"), None,
            f"missing; name a GPU preset: {', '.join(GPU_PRESETS)} (or auto)"
        )
    gpu = gpu_preset(f.join(path, "gpu"), raw["gpu"], detected_gpu)
    changes: dict[str, Any] = {}
    for key, (spec_field, factor) in GPU_OVERRIDES.items():
        if key not in raw:
            continue
        at = f.join(path, key)
        if key == "comm_setup_s":
            changes[spec_field] = f.non_negative_float(at, raw[key])
        elif spec_field == "memory_bytes":
            memory_bytes = round(f.positive_float(at, raw[key], "MAX_MEMORY_GB") * factor)
            if memory_bytes < 1:
                raise ConfigError(at, raw[key], "must be at least one byte (1e-9 GB)")
            changes[spec_field] = memory_bytes
        else:
            changes[spec_field] = f.positive_float(at, raw[key]) * factor
    return ClusterSpec(nodes=nodes, gpus_per_node=per_node, gpu=replace(gpu, **changes))
