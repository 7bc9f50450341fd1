"""Device inventory of a node: NVIDIA (nvidia-ml-py, module ``pynvml``), AMD (pyrsmi / amdsmi),
and CPU virtual devices when neither driver is present.

The vendor query functions take the vendor module (``pynvml``, ``pyrsmi.rocml``) as an argument,
so the same code runs against the real library on a GPU node and against recorded-shape fakes in
the tests. Verified here: with no driver ``pynvml.nvmlInit()`` raises NVMLError_LibraryNotFound,
``pyrsmi.rocml.smi_initialize()`` raises ROCMLError_LibraryNotFound, ``import amdsmi`` can raise
KeyError (so imports are guarded with ``except Exception``); on a single H200 NVLink queries raise
NotSupported. A node with both vendors lists both (a mixed pool); links only join same-vendor
devices.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

from nereus.errors import ConfigError


class VendorUnavailable(Exception):
    """A vendor library or driver is absent; the message says which and why."""


@dataclass(frozen=True)
class Device:
    vendor: str  # "nvidia" | "amd" | "cpu"
    index: int  # the vendor's device index on this node
    name: str
    memory_bytes: int
    bus_id: str  # PCI bus id ("" for virtual devices)


@dataclass(frozen=True)
class Link:
    """A connection between two devices of one node (positions in ``NodeInventory.devices``)."""

    a: int
    b: int
    kind: str  # "nvlink" | "nvswitch" | "xgmi" | "pcie" | "internal" | "loopback"
    count: int  # parallel links (NVLink lanes); 0 when not counted
    detail: str  # topology level or hop count


@dataclass(frozen=True)
class NodeInventory:
    node: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    virtual: bool
    notes: tuple[str, ...]  # why a vendor was not used ("no NVIDIA driver: ...")

    @property
    def vendors(self) -> tuple[str, ...]:
        return tuple(sorted({d.vendor for d in self.devices}))

    @property
    def memory_bytes(self) -> int:
        return sum(d.memory_bytes for d in self.devices)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["vendors"] = list(self.vendors)
        return out


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _bus(value: Any) -> str:
    return _text(value).strip().lower()


# ---------------------------------------------------------------- NVIDIA

_NVML_LEVELS = ((0, "internal"), (10, "single"), (20, "multiple"), (30, "hostbridge"),
                (40, "node"), (50, "system"))
_NVML_REMOTE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH


def query_nvidia(nvml: Any) -> tuple[tuple[Device, ...], tuple[Link, ...]]:
    """Devices and links through an NVML module (``pynvml`` or a fake with its API)."""
    try:
        nvml.nvmlInit()
    except Exception as exc:
        raise VendorUnavailable(f"no NVIDIA driver: {type(exc).__name__}: {exc}") from None
    try:
        count = int(nvml.nvmlDeviceGetCount())
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        devices = tuple(
            Device("nvidia", i, _text(nvml.nvmlDeviceGetName(h)),
                   int(nvml.nvmlDeviceGetMemoryInfo(h).total),
                   _bus(nvml.nvmlDeviceGetPciInfo(h).busId))
            for i, h in enumerate(handles))
        links = _nvidia_links(nvml, handles, devices)
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    if not devices:
        raise VendorUnavailable("no NVIDIA devices: NVML reports 0 GPUs")
    return devices, links


def _nvlinks_of(nvml: Any, handle: Any) -> list[tuple[str, bool]]:
    """(remote bus id, remote is a switch) per active NVLink; [] when NVLink is NotSupported."""
    active = []
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                continue
            remote = _bus(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
        except Exception:
            break  # NotSupported (no NVLink) or InvalidArgument (past the last link)
        try:
            is_switch = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link) == _NVML_REMOTE_SWITCH
        except Exception:
            is_switch = False
        active.append((remote, is_switch))
    return active


def _nvml_level(nvml: Any, h1: Any, h2: Any) -> str:
    try:
        level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(h1, h2))
    except Exception:
        return "unknown"
    return next((name for value, name in _NVML_LEVELS if value == level), f"level-{level}")


def _nvidia_links(nvml: Any, handles: list[Any], devices: tuple[Device, ...]
                  ) -> tuple[Link, ...]:
    by_bus = {d.bus_id: i for i, d in enumerate(devices)}
    pair_count: dict[tuple[int, int], int] = {}
    switch_links = [0] * len(devices)
    for i, handle in enumerate(handles):
        for remote, is_switch in _nvlinks_of(nvml, handle):
            j = by_bus.get(remote)
            if j is not None and j != i:
                key = (min(i, j), max(i, j))
                pair_count[key] = pair_count.get(key, 0) + 1
            elif is_switch:
                switch_links[i] += 1
    links = []
    for i in range(len(devices)):
        for j in range(i + 1, len(devices)):
            if (i, j) in pair_count:
                # each direct link is seen from both ends
                links.append(Link(i, j, "nvlink", max(1, pair_count[(i, j)] // 2), "direct"))
            elif switch_links[i] and switch_links[j]:
                links.append(Link(i, j, "nvswitch", min(switch_links[i], switch_links[j]),
                                  "switch"))
            else:
                level = _nvml_level(nvml, handles[i], handles[j])
                links.append(Link(i, j, "pcie", 0, level))
    return tuple(links)


# ---------------------------------------------------------------- AMD

_AMD_LINK_KINDS = {0: "internal", 1: "pcie", 2: "xgmi"}


def query_amd(rocml: Any) -> tuple[tuple[Device, ...], tuple[Link, ...]]:
    """Devices and links through ``pyrsmi.rocml`` (or a fake with its API)."""
    try:
        rocml.smi_initialize()
    except Exception as exc:
        raise VendorUnavailable(f"no ROCm: {type(exc).__name__}: {exc}") from None
    try:
        count = int(rocml.smi_get_device_count())
        devices = []
        for i in range(max(count, 0)):
            memory = int(rocml.smi_get_device_memory_total(i))
            uid = rocml.smi_get_device_unique_id(i)
            devices.append(Device("amd", i, _text(rocml.smi_get_device_name(i)) or "AMD GPU",
                                  max(memory, 0),
                                  f"{uid:x}" if isinstance(uid, int) and uid >= 0 else ""))
        links = []
        for i in range(len(devices)):
            for j in range(i + 1, len(devices)):
                got = rocml.smi_get_device_link_type(i, j)
                if not isinstance(got, tuple):  # pyrsmi returns -1 on error
                    links.append(Link(i, j, "unknown", 0, "query failed"))
                    continue
                hops, kind = got
                links.append(Link(i, j, _AMD_LINK_KINDS.get(int(kind), "unknown"), 0,
                                  f"{int(hops)} hop" + ("s" if int(hops) != 1 else "")))
    finally:
        with contextlib.suppress(Exception):
            rocml.smi_shutdown()
    if not devices:
        raise VendorUnavailable("no AMD devices: AMD SMI reports 0 GPUs")
    return tuple(devices), tuple(links)


# ---------------------------------------------------------------- loading and assembling

def load_pynvml() -> ModuleType:
    try:
        import pynvml
    except Exception as exc:
        raise VendorUnavailable(f"no NVIDIA driver: nvidia-ml-py not importable ({exc})") from None
    return pynvml


def load_rocml() -> ModuleType:
    try:
        from pyrsmi import rocml
    except Exception as exc:  # amdsmi underneath can raise KeyError at import
        raise VendorUnavailable(f"no ROCm: pyrsmi not importable ({type(exc).__name__}: {exc})"
                                ) from None
    return rocml


def virtual_devices(count: int, memory_bytes: int) -> tuple[tuple[Device, ...], tuple[Link, ...]]:
    """CPU ranks playing ``count`` devices of ``memory_bytes`` each, joined by loopback."""
    if count < 1:
        raise ConfigError("virtual-devices", count, "must be at least 1")
    if memory_bytes <= 0:
        raise ConfigError("virtual-memory-gb", memory_bytes / 1e9, "must be positive")
    devices = tuple(Device("cpu", i, "cpu-virtual", memory_bytes, "") for i in range(count))
    links = tuple(Link(i, j, "loopback", 0, "gloo over TCP")
                  for i in range(count) for j in range(i + 1, count))
    return devices, links


Loader = Callable[[], Any]


def node_inventory(node: str | None = None, virtual_count: int = 2,
                   virtual_memory_bytes: int = 2 * 10**9,
                   nvml_loader: Loader = load_pynvml, rocml_loader: Loader = load_rocml
                   ) -> NodeInventory:
    """Every vendor found on this node (both in a mixed node); CPU virtual devices if none."""
    name = node if node is not None else socket.gethostname().split(".")[0]
    devices: list[Device] = []
    links: list[Link] = []
    notes: list[str] = []
    for loader, query in ((nvml_loader, query_nvidia), (rocml_loader, query_amd)):
        try:
            got_devices, got_links = query(loader())
        except VendorUnavailable as exc:
            notes.append(str(exc))
            continue
        offset = len(devices)
        devices += got_devices
        links += [Link(lk.a + offset, lk.b + offset, lk.kind, lk.count, lk.detail)
                  for lk in got_links]
    if devices:
        return NodeInventory(name, tuple(devices), tuple(links), False, tuple(notes))
    cpu_devices, cpu_links = virtual_devices(virtual_count, virtual_memory_bytes)
    return NodeInventory(name, cpu_devices, cpu_links, True, tuple(notes))
