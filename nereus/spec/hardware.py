"""Accelerator presets, op classes and the cluster a job runs on."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class OpClass(str, Enum):
    """Operation classes with one calibrated efficiency each (DESIGN.md §3)."""

    GEMM = "gemm"
    ATTENTION = "attention"
    DECODE_MEMORY = "decode-memory"
    ALLREDUCE_INTRA = "allreduce-intra"
    ALLREDUCE_INTER = "allreduce-inter"
    P2P_INTRA = "p2p-intra"
    P2P_INTER = "p2p-inter"
    ALLGATHER_INTRA = "allgather-intra"
    ALLGATHER_INTER = "allgather-inter"
    COPY = "copy"


# Efficiency an op class starts with on hardware where it was never measured.
CONSERVATIVE_EFFICIENCY = 0.3


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator (or a CPU rank playing one).

    Bandwidths are unidirectional per device, in GB/s (1e9 bytes per second).
    """

    name: str
    vendor: str  # "nvidia" | "amd" | "cpu"
    memory_bytes: int
    peak_flops: float  # dense bf16 FLOP/s
    hbm_gbps: float
    intra_node_gbps: float  # NVLink / Infinity Fabric (CPU: loopback)
    inter_node_gbps: float  # InfiniBand / Slingshot (CPU: loopback TCP)
    comm_setup_s: float = 0.05  # creating one communicator (NCCL/RCCL/gloo) for a transition


H200 = GpuSpec(
    name="h200", vendor="nvidia", memory_bytes=141 * 10**9, peak_flops=989.5e12,
    hbm_gbps=4800.0, intra_node_gbps=450.0, inter_node_gbps=50.0,
)
A100_64GB = GpuSpec(
    name="a100-64gb", vendor="nvidia", memory_bytes=64 * 10**9, peak_flops=312e12,
    hbm_gbps=2039.0, intra_node_gbps=300.0, inter_node_gbps=25.0,
)
# Datasheet figures (data/SOURCES.md): dense bf16 peak, HBM bandwidth, unidirectional NVLink /
# Infinity Fabric per device, one 200 / 400 Gb/s NIC per GPU.
A100_80GB = GpuSpec(  # NVIDIA A100 80GB SXM: 312 TFLOP/s, 2,039 GB/s, NVLink 600 GB/s bidirectional
    name="a100-80gb", vendor="nvidia", memory_bytes=80 * 10**9, peak_flops=312e12,
    hbm_gbps=2039.0, intra_node_gbps=300.0, inter_node_gbps=25.0,
)
H100_80GB = GpuSpec(  # NVIDIA H100 SXM 80GB: 989.4 TFLOP/s, 3.35 TB/s, NVLink 900 GB/s bidirectional
    name="h100-80gb", vendor="nvidia", memory_bytes=80 * 10**9, peak_flops=989.4e12,
    hbm_gbps=3350.0, intra_node_gbps=450.0, inter_node_gbps=50.0,
)
MI300X = GpuSpec(  # AMD Instinct MI300X: 1,307.4 TFLOP/s, 5.3 TB/s, 7 xGMI links x 64 GB/s
    name="mi300x", vendor="amd", memory_bytes=192 * 10**9, peak_flops=1307.4e12,
    hbm_gbps=5300.0, intra_node_gbps=448.0, inter_node_gbps=50.0,
)
# One Graphics Compute Die of an MI250X (each card is two GCDs, each its own device).
MI250X_GCD = GpuSpec(
    name="mi250x-gcd", vendor="amd", memory_bytes=64 * 10**9, peak_flops=191.5e12,
    hbm_gbps=1638.0, intra_node_gbps=100.0, inter_node_gbps=25.0,
)
# A CPU rank under gloo playing one GPU; its capacity is set per run.
CPU_VIRTUAL = GpuSpec(
    name="cpu", vendor="cpu", memory_bytes=2 * 10**9, peak_flops=50e9,
    hbm_gbps=10.0, intra_node_gbps=2.0, inter_node_gbps=1.0, comm_setup_s=0.015,
)

GPU_PRESETS: dict[str, GpuSpec] = {
    g.name: g for g in (H200, A100_64GB, A100_80GB, H100_80GB, MI250X_GCD, MI300X, CPU_VIRTUAL)
}


@dataclass(frozen=True)
class ClusterSpec:
    """A homogeneous cluster: ``nodes`` nodes of ``gpus_per_node`` devices of one kind.

    GPU ids are global: ``gpu_id = node * gpus_per_node + local_index``.
    """

    nodes: int
    gpus_per_node: int
    gpu: GpuSpec
    # CPU ranks playing GPUs share the cores of their host(s): ``host_cores`` per host (0: every
    # device computes on its own, as GPUs do), over ``hosts`` hosts, with ``busy_gpus`` ranks
    # running at once (the pool; 0: every GPU of the cluster).
    host_cores: int = 0
    hosts: int = 1
    busy_gpus: int = 0

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def contention(self) -> float:
        """How many times slower a rank runs than alone on a core: ranks per host over its
        cores, at least 1 (1 for devices of their own)."""
        if self.host_cores <= 0:
            return 1.0
        busy = self.busy_gpus or self.num_gpus
        return max(1.0, busy / max(1, self.hosts) / self.host_cores)

    def node_of(self, gpu_id: int) -> int:
        return gpu_id // self.gpus_per_node

    def all_gpus(self) -> tuple[int, ...]:
        return tuple(range(self.num_gpus))
