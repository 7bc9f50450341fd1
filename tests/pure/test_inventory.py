"""nereus.cluster.inventory and ``nereus inventory``.

No GPU driver exists on this machine, so two kinds of test run here:
- the real vendor libraries (nvidia-ml-py, pyrsmi) failing without a driver -> CPU virtual
  devices with the reason (real, no mock);
- the structuring code against FAKE vendor modules: the vendor libraries cannot run here (this
  is the allowed mock case). The fakes have the call names, argument order, return shapes
  (str names, bytes bus ids, ``.total`` bytes, pyrsmi's ``(hops, type)`` tuples and -1 on error)
  and exception classes of nvidia-ml-py 13 and pyrsmi 1.1; the device values (H200, MI250X
  sizes, NVSwitch/XGMI layouts) are representative figures, not recordings from hardware.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from nereus.cli import main
from nereus.cluster.inventory import (
    VendorUnavailable,
    load_pynvml,
    load_rocml,
    node_inventory,
    query_amd,
    query_nvidia,
    virtual_devices,
)
from nereus.errors import ConfigError

pynvml = pytest.importorskip("pynvml")

H200_BYTES = 150_754_820_096  # 143,771 MiB as NVML reports an H200
MI250X_GCD_BYTES = 68_702_699_520  # 64 GiB per GCD


@dataclass
class _Mem:
    total: int


@dataclass
class _Pci:
    busId: bytes  # pynvml's field name


class FakeNvml:
    """FAKE pynvml (see module docstring). ``links[i]`` lists (remote bus id, remote type)."""

    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, names: list[str], links: dict[int, list[tuple[bytes, int]]] | None = None,
                 init_error: int | None = None, topology_level: int = 40) -> None:
        self.names = names
        self.links = links
        self.init_error = init_error
        self.topology_level = topology_level
        self.shutdown_calls = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.names[h]

    def nvmlDeviceGetMemoryInfo(self, h: int) -> _Mem:
        return _Mem(H200_BYTES)

    def nvmlDeviceGetPciInfo(self, h: int) -> _Pci:
        return _Pci(f"00000000:{0x18 + h:02X}:00.0".encode())

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if self.links is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(self.links[h]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> _Pci:
        assert self.links is not None
        return _Pci(self.links[h][link][0])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:
        assert self.links is not None
        return self.links[h][link][1]

    def nvmlDeviceGetTopologyCommonAncestor(self, h1: int, h2: int) -> int:
        return self.topology_level


def _bus(i: int) -> bytes:
    return f"00000000:{0x18 + i:02X}:00.0".encode()


class FakeRocml:
    """FAKE pyrsmi.rocml (see module docstring): GCDs paired on cards, XGMI between all."""

    def __init__(self, count: int, fail_link: tuple[int, int] | None = None) -> None:
        self.count = count
        self.fail_link = fail_link

    def smi_initialize(self) -> None:
        pass

    def smi_shutdown(self) -> None:
        pass

    def smi_get_device_count(self) -> int:
        return self.count

    def smi_get_device_name(self, i: int) -> str:
        return "AMD Instinct MI250X"

    def smi_get_device_memory_total(self, i: int) -> int:
        return MI250X_GCD_BYTES

    def smi_get_device_unique_id(self, i: int) -> int:
        return 0xC1000 + i

    def smi_get_device_link_type(self, i: int, j: int) -> tuple[int, int] | int:
        if (i, j) == self.fail_link:
            return -1
        return (1 if i // 2 == j // 2 else 2, 2)  # AMDSMI_LINK_TYPE_XGMI


def _fail(exc: Exception) -> Any:
    def loader() -> Any:
        raise exc
    return loader


def test_no_driver_here_gives_cpu_virtual_devices_and_says_why() -> None:
    """Real libraries, no driver on this machine: nothing faked."""
    inv = node_inventory("n1", virtual_count=3, virtual_memory_bytes=4 * 10**9)
    if not inv.virtual:
        pytest.skip("a GPU driver is present on this machine")
    assert inv.vendors == ("cpu",) and len(inv.devices) == 3
    assert inv.memory_bytes == 12 * 10**9
    assert inv.notes[0].startswith("no NVIDIA driver: NVMLError_LibraryNotFound")
    assert inv.notes[1].startswith("no ROCm: ")
    assert {(lk.a, lk.b, lk.kind) for lk in inv.links} == {
        (0, 1, "loopback"), (0, 2, "loopback"), (1, 2, "loopback")}
    with pytest.raises(VendorUnavailable, match="no NVIDIA driver"):
        query_nvidia(load_pynvml())
    with pytest.raises(VendorUnavailable, match="no ROCm"):
        query_amd(load_rocml())


def test_single_h200_nvlink_not_supported() -> None:
    fake = FakeNvml(["NVIDIA H200"])
    devices, links = query_nvidia(fake)
    assert [(d.vendor, d.name, d.memory_bytes, d.bus_id) for d in devices] == [
        ("nvidia", "NVIDIA H200", H200_BYTES, "00000000:18:00.0")]
    assert links == () and fake.shutdown_calls == 1


def test_hgx_h200_all_pairs_through_nvswitch() -> None:
    switch = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
    links = {i: [(f"00000000:{0x80 + k % 4:02X}:00.0".encode(), switch) for k in range(18)]
             for i in range(8)}
    devices, got = query_nvidia(FakeNvml(["NVIDIA H200"] * 8, links))
    assert len(devices) == 8 and len(got) == 28
    assert {(lk.kind, lk.count) for lk in got} == {("nvswitch", 18)}


def test_direct_nvlink_mesh_and_pcie_fallback() -> None:
    # GPUs 0 and 1 joined by 4 direct NVLinks; GPU 2 has no active link
    links = {0: [(_bus(1), 0)] * 4, 1: [(_bus(0), 0)] * 4, 2: []}
    _, got = query_nvidia(FakeNvml(["NVIDIA A100-SXM4-64GB"] * 3, links,
                                   topology_level=50))
    by_pair = {(lk.a, lk.b): (lk.kind, lk.count, lk.detail) for lk in got}
    assert by_pair == {(0, 1): ("nvlink", 4, "direct"), (0, 2): ("pcie", 0, "system"),
                       (1, 2): ("pcie", 0, "system")}


def test_nvml_init_failure_and_zero_devices() -> None:
    with pytest.raises(VendorUnavailable, match="NVMLError_DriverNotLoaded"):
        query_nvidia(FakeNvml(["x"], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    with pytest.raises(VendorUnavailable, match="0 GPUs"):
        query_nvidia(FakeNvml([]))


def test_mi250x_gcds_over_xgmi() -> None:
    devices, links = query_amd(FakeRocml(4, fail_link=(2, 3)))
    assert [(d.vendor, d.memory_bytes, d.bus_id) for d in devices][:2] == [
        ("amd", MI250X_GCD_BYTES, "c1000"), ("amd", MI250X_GCD_BYTES, "c1001")]
    by_pair = {(lk.a, lk.b): (lk.kind, lk.detail) for lk in links}
    assert by_pair[(0, 1)] == ("xgmi", "1 hop") and by_pair[(0, 2)] == ("xgmi", "2 hops")
    assert by_pair[(2, 3)] == ("unknown", "query failed")  # pyrsmi returned -1


def test_mixed_vendor_node_lists_both_with_offset_links() -> None:
    inv = node_inventory("mix1", nvml_loader=lambda: FakeNvml(["NVIDIA H200"]),
                         rocml_loader=lambda: FakeRocml(2))
    assert inv.vendors == ("amd", "nvidia") and not inv.virtual
    assert [d.vendor for d in inv.devices] == ["nvidia", "amd", "amd"]
    assert [(lk.a, lk.b, lk.kind) for lk in inv.links] == [(1, 2, "xgmi")]
    assert inv.memory_bytes == H200_BYTES + 2 * MI250X_GCD_BYTES
    assert inv.to_dict()["vendors"] == ["amd", "nvidia"]


def test_one_vendor_missing_is_noted_not_fatal() -> None:
    inv = node_inventory("g1", nvml_loader=lambda: FakeNvml(["NVIDIA H200"]),
                         rocml_loader=_fail(VendorUnavailable("no ROCm: KeyError: 'x'")))
    assert inv.vendors == ("nvidia",) and inv.notes == ("no ROCm: KeyError: 'x'",)


def test_virtual_devices_validate() -> None:
    with pytest.raises(ConfigError):
        virtual_devices(0, 10**9)
    with pytest.raises(ConfigError):
        virtual_devices(2, 0)


def test_cli_json_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inventory", "--json", "--virtual-devices", "3", "--virtual-memory-gb", "1.5"]
                ) == 0
    report = json.loads(capsys.readouterr().out)["nodes"][0]
    if report["virtual"]:
        assert [d["memory_bytes"] for d in report["devices"]] == [1_500_000_000] * 3
        assert any("no NVIDIA driver" in n for n in report["notes"])
    assert main(["inventory"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("node ")
    if report["virtual"]:
        assert "(CPU virtual devices)" in text and "why: no NVIDIA driver" in text
        assert "link 0-1: loopback" in text
