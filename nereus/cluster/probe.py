"""The facts device selection needs, read once per process (effectful: torch, NVML / ROCm SMI).

:func:`device_facts` asks torch what it was built for and how many devices it sees, takes the
local rank and the visible-device lists from the job environment (:mod:`nereus.cluster.env`,
the one reader of the environment) and the vendors from the node's inventory;
:func:`nereus.cluster.devices.select_device` decides from them.
"""

from __future__ import annotations

from typing import Any

from nereus.cluster.devices import BUILD_VENDOR, DetectedDevice, DeviceFacts, gpu_from_inventory
from nereus.cluster.env import JobEnvironment
from nereus.cluster.inventory import NodeInventory, node_inventory
from nereus.spec.hardware import GpuSpec


def torch_build() -> str:
    """``hip`` for a ROCm build of torch, ``cuda`` for a CUDA build, else ``cpu``."""
    import torch

    if getattr(torch.version, "hip", None):
        return "hip"
    if getattr(torch.version, "cuda", None):
        return "cuda"
    return "cpu"


def visible_device_count() -> int:
    """Devices torch sees (0 without a driver or on a CPU build)."""
    import torch

    try:
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # a broken driver answers like no driver
        return 0


def inventory_devices(inv: NodeInventory) -> tuple[DetectedDevice, ...]:
    return tuple(DetectedDevice(d.vendor, d.name, d.memory_bytes) for d in inv.devices
                 if not inv.virtual)


def device_facts(job: JobEnvironment, inv: NodeInventory | None = None) -> DeviceFacts:
    """This process's facts (``inv``: the node's inventory, taken here when not given)."""
    inv = inv if inv is not None else node_inventory(node=job.node_name)
    vendors = () if inv.virtual else inv.vendors
    return DeviceFacts(torch_build(), visible_device_count(), vendors, job.local_rank,
                       job.local_world_size, job.cuda_visible_devices, job.rocr_visible_devices)


def torch_devices() -> tuple[DetectedDevice, ...]:
    """The devices torch sees, as inventory entries (where NVML / ROCm SMI is not installed)."""
    import torch

    vendor = BUILD_VENDOR.get(torch_build())
    if vendor is None or visible_device_count() == 0:
        return ()
    return tuple(DetectedDevice(vendor, torch.cuda.get_device_name(i),
                                int(torch.cuda.get_device_properties(i).total_memory))
                 for i in range(visible_device_count()))


def detected_gpu(inv: NodeInventory | None = None) -> GpuSpec:
    """The GPU ``cluster.gpu: auto`` stands for on this node: from the inventory (NVML, ROCm
    SMI), else from what torch sees."""
    inv = inv if inv is not None else node_inventory()
    devices = inventory_devices(inv) or torch_devices()
    return gpu_from_inventory(devices, BUILD_VENDOR.get(torch_build()))


def describe_facts(facts: DeviceFacts) -> dict[str, Any]:
    return {"torch_build": facts.torch_build, "visible": facts.visible,
            "inventory_vendors": list(facts.inventory_vendors), "local_rank": facts.local_rank,
            "local_world_size": facts.local_world_size}
