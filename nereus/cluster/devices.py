"""Which device a rank computes on, and which GPU ``cluster.gpu: auto`` names (pure).

The shell gathers the facts once per process (:func:`nereus.cluster.probe.device_facts`: torch's
build and device count, the node's inventory, the job environment's local rank and visible-device
lists); everything here is a function of those facts, so it is tested for NVIDIA, AMD, CPU and
mixed nodes without any of them.

Rules (DESIGN.md §4: "each rank binds its device from the job environment"):
- ``runtime.device: cpu`` — the CPU (gloo, the host transport), whatever the node has;
- ``auto`` (default) — a GPU when the cluster names one (``cluster.gpu`` is not the CPU virtual
  device), torch was built for a GPU vendor present on the node and it sees at least one device;
  else the CPU, with the reason. A job configured for the CPU virtual device stays on the CPU on
  a GPU node too, so the CPU examples behave the same everywhere;
- ``cuda`` — a GPU or a one-line error naming what is missing. ROCm builds of torch answer as
  ``cuda`` (HIP devices are torch's ``cuda`` devices), their vendor is ``amd``.
One GPU per rank: local rank ``i`` of a node takes visible device ``i mod n``; when a node has
more ranks than visible devices, ranks share a device (``shared``), which the transport choice
turns into the host transport (NCCL refuses two ranks of one communicator on one GPU).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nereus.errors import ConfigError
from nereus.spec.hardware import GPU_PRESETS, GpuSpec

CPU, CUDA, AUTO = "cpu", "cuda", "auto"
DEVICE_MODES = (AUTO, CPU, CUDA)
BUILD_VENDOR = {"cuda": "nvidia", "hip": "amd"}  # torch's accelerator build → device vendor
_HIDDEN = ("", "-1", "NoDevFiles", "none")  # *_VISIBLE_DEVICES values that hide every device


@dataclass(frozen=True)
class DeviceFacts:
    """What one process sees. ``torch_build``: ``cuda``, ``hip`` or ``cpu`` (the accelerator
    torch was built for); ``visible``: devices torch counts (after the visible-device lists);
    ``inventory_vendors``: vendors of the node's devices (NVML / ROCm SMI; () when none answered);
    ``local_rank`` / ``local_world_size``: this rank among the job's ranks on its node;
    ``cuda_visible_devices`` / ``rocr_visible_devices``: the job environment's lists (None when
    unset; ``HIP_VISIBLE_DEVICES`` is read as the ROCm list)."""

    torch_build: str
    visible: int
    inventory_vendors: tuple[str, ...] = ()
    local_rank: int = 0
    local_world_size: int = 1
    cuda_visible_devices: str | None = None
    rocr_visible_devices: str | None = None


@dataclass(frozen=True)
class DeviceChoice:
    """The device of one rank: ``kind`` ``cpu`` or ``cuda`` (torch's name, for ROCm too),
    ``vendor`` ``cpu``, ``nvidia`` or ``amd``, ``index`` torch's device index (-1 on the CPU),
    ``device_id`` the physical device on its node (``vendor:entry`` of the visible list, else
    ``vendor:index``; "" on the CPU), ``shared`` whether other ranks of the node use it too,
    ``reason`` why (one line)."""

    kind: str
    vendor: str
    index: int
    device_id: str
    shared: bool
    reason: str

    @property
    def torch_device(self) -> str:
        return CPU if self.kind == CPU else f"cuda:{self.index}"

    @property
    def on_gpu(self) -> bool:
        return self.kind == CUDA

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "vendor": self.vendor, "index": self.index,
                "device_id": self.device_id, "shared": self.shared, "reason": self.reason}


def visible_list(value: str | None) -> tuple[str, ...] | None:
    """A ``*_VISIBLE_DEVICES`` value as its entries (None: unset, () hides every device)."""
    if value is None:
        return None
    if value.strip() in _HIDDEN:
        return ()
    return tuple(e.strip() for e in value.split(",") if e.strip())


def cpu_choice(reason: str) -> DeviceChoice:
    return DeviceChoice(CPU, CPU, -1, "", False, reason)


def _gpu_or_why(facts: DeviceFacts) -> DeviceChoice | str:
    """This rank's GPU, or why it has none."""
    vendor = BUILD_VENDOR.get(facts.torch_build)
    if vendor is None:
        return "torch is a CPU build (no CUDA or ROCm)"
    listed = visible_list(facts.cuda_visible_devices if vendor == "nvidia"
                          else facts.rocr_visible_devices)
    name = "CUDA_VISIBLE_DEVICES" if vendor == "nvidia" else "ROCR_VISIBLE_DEVICES"
    if listed == ():
        return f"{name} hides every device"
    if facts.visible < 1:
        present = ", ".join(facts.inventory_vendors) or "none"
        return f"torch ({facts.torch_build} build) sees no {vendor} device (node inventory: {present})"
    if facts.inventory_vendors and vendor not in facts.inventory_vendors:
        return (f"torch is a {facts.torch_build} build but the node has "
                f"{', '.join(facts.inventory_vendors)} devices only")
    index = facts.local_rank % facts.visible
    physical = listed[index] if listed is not None and index < len(listed) else str(index)
    shared = facts.local_world_size > facts.visible
    reason = f"local rank {facts.local_rank} of {facts.local_world_size} → {vendor} device {index}"
    if listed is not None:
        reason += f" ({name}={','.join(listed)})"
    if shared:
        reason += f"; {facts.local_world_size} ranks share {facts.visible} device(s)"
    return DeviceChoice(CUDA, vendor, index, f"{vendor}:{physical}", shared, reason)


def select_device(requested: str, facts: DeviceFacts, cluster_vendor: str) -> DeviceChoice:
    """The device of this rank for ``runtime.device`` = ``requested`` (see the module text);
    ``cluster_vendor``: the vendor of ``cluster.gpu`` (``cpu`` for the CPU virtual device).
    Raises ConfigError (``runtime.device``) when ``cuda`` cannot be honoured or the hardware's
    vendor contradicts the cluster's."""
    if requested not in DEVICE_MODES:
        raise ConfigError("runtime.device", requested, f"must be one of {', '.join(DEVICE_MODES)}")
    if requested == CPU:
        return cpu_choice("runtime.device: cpu")
    if requested == AUTO and cluster_vendor == CPU:
        return cpu_choice("cluster.gpu is the CPU virtual device")
    got = _gpu_or_why(facts)
    if isinstance(got, str):
        if requested == CUDA:
            raise ConfigError("runtime.device", requested, f"no GPU for this rank: {got}")
        return cpu_choice(f"no GPU: {got}")
    if cluster_vendor not in (CPU, got.vendor):
        raise ConfigError("runtime.device", requested,
                          f"the cluster's GPU is {cluster_vendor} but this rank drives "
                          f"{got.vendor} devices; set cluster.gpu: auto or name the hardware")
    return got


# ---------------------------------------------------------------- cluster.gpu: auto

# Inventory names (NVML, ROCm SMI) → presets: the first preset whose key the name contains.
_NAME_TO_PRESET = (("h200", "h200"), ("a100", "a100-64gb"), ("mi250x", "mi250x-gcd"),
                   ("mi250", "mi250x-gcd"))
# The preset a device of an unknown name starts from (its memory comes from the inventory).
_VENDOR_PRESET = {"nvidia": "h200", "amd": "mi250x-gcd"}


@dataclass(frozen=True)
class DetectedDevice:
    """One device of the node's inventory, as plain data."""

    vendor: str
    name: str
    memory_bytes: int


def gpu_from_inventory(devices: tuple[DetectedDevice, ...], build_vendor: str | None = None
                       ) -> GpuSpec:
    """The GpuSpec ``cluster.gpu: auto`` stands for on a node with ``devices`` (its inventory):
    the preset its name matches, with the device's own memory; an unknown GPU starts from its
    vendor's preset (speeds) and the calibration refines them; no GPU: the CPU virtual device.
    On a node with both vendors, the vendor torch drives (``build_vendor``) is taken."""
    gpus = [d for d in devices if d.vendor in _VENDOR_PRESET]
    if build_vendor is not None and any(d.vendor == build_vendor for d in gpus):
        gpus = [d for d in gpus if d.vendor == build_vendor]
    if not gpus:
        return GPU_PRESETS["cpu"]
    first = gpus[0]
    low = first.name.lower()
    squashed = re.sub(r"[^a-z0-9]", "", low)
    match = next((preset for part, preset in _NAME_TO_PRESET if part in squashed), None)
    if match is not None and GPU_PRESETS[match].vendor == first.vendor:
        preset, name = GPU_PRESETS[match], GPU_PRESETS[match].name
    else:
        preset = GPU_PRESETS[_VENDOR_PRESET[first.vendor]]
        name = re.sub(r"[^a-z0-9]+", "-", low).strip("-") or f"{first.vendor}-gpu"
    memory = min(d.memory_bytes for d in gpus)
    return GpuSpec(name=name, vendor=preset.vendor,
                   memory_bytes=memory if memory > 0 else preset.memory_bytes,
                   peak_flops=preset.peak_flops, hbm_gbps=preset.hbm_gbps,
                   intra_node_gbps=preset.intra_node_gbps,
                   inter_node_gbps=preset.inter_node_gbps, comm_setup_s=preset.comm_setup_s,
                   host_link_gbps=preset.host_link_gbps,
                   host_memory_bytes=preset.host_memory_bytes)
