"""Accelerator presets, op classes and the cluster a job runs on."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from nereus.errors import ConfigError


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
    # Host staging (a transition's old shards parked in pinned host memory, DESIGN.md §2.3):
    # pinned host↔device copy bandwidth per device (GB/s, one direction), and the pinned host
    # memory one device's rank may fill (half of the node's DRAM per device: the rest is the
    # job's own, data loaders, the OS).
    host_link_gbps: float = 25.0
    host_memory_bytes: int = 64 * 10**9
    # The vendor a CPU virtual device plays in a heterogeneous job run on CPU ranks
    # (``cluster.nodes[i].vendor``): its pairs with the other label are cross-vendor pairs.
    label: str = ""

    @property
    def plays(self) -> str:
        """The vendor that decides transports and links: the label of a labelled CPU virtual
        device, else the vendor."""
        return self.label or self.vendor


H200 = GpuSpec(  # host: 55 GB/s pinned copies measured on the H200; DGX H200 2 TB / 8 GPUs
    name="h200", vendor="nvidia", memory_bytes=141 * 10**9, peak_flops=989.5e12,
    hbm_gbps=4800.0, intra_node_gbps=450.0, inter_node_gbps=50.0,
    host_link_gbps=55.0, host_memory_bytes=128 * 10**9,
)
A100_64GB = GpuSpec(  # host: PCIe 4.0 x16; CINECA Leonardo booster: 512 GB DDR4 / 4 GPUs
    name="a100-64gb", vendor="nvidia", memory_bytes=64 * 10**9, peak_flops=312e12,
    hbm_gbps=2039.0, intra_node_gbps=300.0, inter_node_gbps=25.0,
    host_link_gbps=25.0, host_memory_bytes=64 * 10**9,
)
# Datasheet figures (data/SOURCES.md): dense bf16 peak, HBM bandwidth, unidirectional NVLink /
# Infinity Fabric per device, one 200 / 400 Gb/s NIC per GPU.
A100_80GB = GpuSpec(  # NVIDIA A100 80GB SXM: 312 TFLOP/s, 2,039 GB/s, NVLink 600 GB/s bidirectional
    name="a100-80gb", vendor="nvidia", memory_bytes=80 * 10**9, peak_flops=312e12,
    hbm_gbps=2039.0, intra_node_gbps=300.0, inter_node_gbps=25.0,
    host_link_gbps=25.0, host_memory_bytes=128 * 10**9,  # PCIe 4.0; DGX A100 2 TB / 8
)
H100_80GB = GpuSpec(  # NVIDIA H100 SXM 80GB: 989.4 TFLOP/s, 3.35 TB/s, NVLink 900 GB/s bidirectional
    name="h100-80gb", vendor="nvidia", memory_bytes=80 * 10**9, peak_flops=989.4e12,
    hbm_gbps=3350.0, intra_node_gbps=450.0, inter_node_gbps=50.0,
    host_link_gbps=55.0, host_memory_bytes=128 * 10**9,  # PCIe 5.0 as the H200; DGX H100 2 TB
)
MI300X = GpuSpec(  # AMD Instinct MI300X: 1,307.4 TFLOP/s, 5.3 TB/s, 7 xGMI links x 64 GB/s
    name="mi300x", vendor="amd", memory_bytes=192 * 10**9, peak_flops=1307.4e12,
    hbm_gbps=5300.0, intra_node_gbps=448.0, inter_node_gbps=50.0,
    host_link_gbps=55.0, host_memory_bytes=128 * 10**9,  # PCIe 5.0 x16; 2 TB / 8 GPUs
)
# One Graphics Compute Die of an MI250X (each card is two GCDs, each its own device).
MI250X_GCD = GpuSpec(
    name="mi250x-gcd", vendor="amd", memory_bytes=64 * 10**9, peak_flops=191.5e12,
    hbm_gbps=1638.0, intra_node_gbps=100.0, inter_node_gbps=25.0,
    host_link_gbps=36.0, host_memory_bytes=32 * 10**9,  # Frontier: 36 GB/s CPU link per GCD, 512 GB / 8
)
# A CPU rank under gloo playing one GPU; its capacity is set per run.
CPU_VIRTUAL = GpuSpec(
    name="cpu", vendor="cpu", memory_bytes=2 * 10**9, peak_flops=50e9,
    hbm_gbps=10.0, intra_node_gbps=2.0, inter_node_gbps=1.0, comm_setup_s=0.015,
    host_link_gbps=5.0, host_memory_bytes=4 * 10**9,  # a memcpy into another buffer
)

GPU_PRESETS: dict[str, GpuSpec] = {
    g.name: g for g in (H200, A100_64GB, A100_80GB, H100_80GB, MI250X_GCD, MI300X, CPU_VIRTUAL)
}


# The host transport's link class (DESIGN.md §4 *Transports*): device tensors staged through
# pinned host buffers (≈55 GB/s measured on the H200) and sent by gloo over TCP between nodes —
# the pairs NCCL and RCCL cannot join (different vendors). Assumed: one 100 Gb/s TCP path per GPU
# pair, 12.5 GB/s; ``cluster.host_gbps`` sets it.
DEFAULT_HOST_GBPS = 12.5


@dataclass(frozen=True)
class NodeGroup:
    """``count`` consecutive nodes with one kind of hardware (``gpu``: vendor, model, memory, links)."""

    count: int
    gpu: GpuSpec


@dataclass(frozen=True)
class ClusterSpec:
    """The cluster: ``nodes`` nodes of ``gpus_per_node`` devices each.

    GPU ids are global: ``gpu_id = node * gpus_per_node + local_index``. Homogeneous (``groups``
    empty): every node has ``gpu``. Heterogeneous (:meth:`mixed`): ``groups`` gives the hardware
    of the nodes in node order, and ``gpu`` is that of node 0 (per-node hardware: :meth:`gpu_of`,
    :meth:`node_gpu`; one hardware type's view: :meth:`typed`).
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
    groups: tuple[NodeGroup, ...] = ()
    host_gbps: float = DEFAULT_HOST_GBPS  # the host transport's bandwidth per GPU pair, GB/s

    @staticmethod
    def mixed(groups: tuple[NodeGroup, ...], gpus_per_node: int,
              host_gbps: float = DEFAULT_HOST_GBPS) -> ClusterSpec:
        """A cluster of node groups (a single hardware type gives the homogeneous spec).

        Hardware types are told apart by name: two groups of one name have one GpuSpec."""
        if not groups or any(g.count < 1 for g in groups):
            raise ConfigError("cluster.nodes", len(groups),
                              "needs node groups of at least one node each")
        named: dict[str, GpuSpec] = {}
        for i, g in enumerate(groups):
            if named.setdefault(g.gpu.name, g.gpu) != g.gpu:
                raise ConfigError(f"cluster.nodes[{i}].gpu", g.gpu.name,
                                  "differs from an earlier group of that name (other memory or "
                                  "links): give it a name of its own")
        nodes = sum(g.count for g in groups)
        if len(named) == 1:
            return ClusterSpec(nodes, gpus_per_node, groups[0].gpu, host_gbps=host_gbps)
        return ClusterSpec(nodes, gpus_per_node, groups[0].gpu, groups=groups,
                           host_gbps=host_gbps)

    @staticmethod
    def of_nodes(node_gpus: tuple[GpuSpec, ...], gpus_per_node: int,
                 host_gbps: float = DEFAULT_HOST_GBPS) -> ClusterSpec:
        """The cluster whose node ``i`` has ``node_gpus[i]`` (what rank 0 gathers from every
        node's inventory at start, in node order): consecutive nodes of one kind form a group."""
        groups: list[NodeGroup] = []
        for gpu in node_gpus:
            if groups and groups[-1].gpu == gpu:
                groups[-1] = NodeGroup(groups[-1].count + 1, gpu)
            else:
                groups.append(NodeGroup(1, gpu))
        return ClusterSpec.mixed(tuple(groups), gpus_per_node, host_gbps)

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

    # ---------------------------------------------------------------- per-node hardware
    @property
    def heterogeneous(self) -> bool:
        return len(self.types) > 1

    @property
    def types(self) -> tuple[GpuSpec, ...]:
        """The hardware types, in order of their first node."""
        if not self.groups:
            return (self.gpu,)
        out: list[GpuSpec] = []
        for g in self.groups:
            if g.gpu not in out:
                out.append(g.gpu)
        return tuple(out)

    def node_gpu(self, node: int) -> GpuSpec:
        """The hardware of ``node``."""
        first = 0
        for g in self.groups:
            if node < first + g.count:
                return g.gpu
            first += g.count
        return self.gpu

    def gpu_of(self, gpu_id: int) -> GpuSpec:
        """The hardware of GPU ``gpu_id``."""
        return self.node_gpu(gpu_id // self.gpus_per_node) if self.groups else self.gpu

    def type_name(self, gpu_id: int) -> str:
        return self.gpu_of(gpu_id).name

    def gpus_of(self, gpu: GpuSpec) -> tuple[int, ...]:
        """Every GPU id whose node has ``gpu``."""
        if not self.groups:
            return self.all_gpus() if gpu == self.gpu else ()
        out: list[int] = []
        first = 0
        for g in self.groups:
            if g.gpu == gpu:
                out.extend(range(first * self.gpus_per_node,
                                 (first + g.count) * self.gpus_per_node))
            first += g.count
        return tuple(out)

    def typed(self, gpu: GpuSpec) -> ClusterSpec:
        """A homogeneous view of the cluster as if every node had ``gpu`` (same node grid and GPU
        ids): what costs the units placed on that type's GPUs."""
        return ClusterSpec(self.nodes, self.gpus_per_node, gpu, self.host_cores, self.hosts,
                           self.busy_gpus, (), self.host_gbps)

    def with_capacity(self, gpu_ids: tuple[int, ...], memory_bytes: int) -> ClusterSpec:
        """The cluster whose hardware types of ``gpu_ids`` offer ``memory_bytes`` each (what the
        devices reported when they ran out of memory); the other types keep theirs."""
        if not self.groups:
            return replace(self, gpu=replace(self.gpu, memory_bytes=memory_bytes))
        names = {self.type_name(g) for g in gpu_ids}

        def lowered(gpu: GpuSpec) -> GpuSpec:
            return replace(gpu, memory_bytes=memory_bytes) if gpu.name in names else gpu

        return replace(self, gpu=lowered(self.gpu),
                       groups=tuple(NodeGroup(g.count, lowered(g.gpu)) for g in self.groups))

    def same_transport(self, a: int, b: int) -> bool:
        """Whether GPUs ``a`` and ``b`` can share a device communicator (NCCL or RCCL): the same
        vendor, and not CPU ranks (those always use the host transport anyway)."""
        return self.gpu_of(a).plays == self.gpu_of(b).plays

    def pair_gbps(self, a: int, b: int) -> float:
        """Nominal GB/s of a transfer from GPU ``a`` to GPU ``b``: the intra-node link inside a
        node, the inter-node link (the slower end's) between nodes of one vendor, and the host
        transport's link class between vendors."""
        ga, gb = self.gpu_of(a), self.gpu_of(b)
        if a // self.gpus_per_node == b // self.gpus_per_node:
            return ga.intra_node_gbps
        if ga.plays != gb.plays:
            return self.host_gbps
        return min(ga.inter_node_gbps, gb.inter_node_gbps)
