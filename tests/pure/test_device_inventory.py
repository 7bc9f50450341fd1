"""``nereus inventory`` says what a rank started here would run on: the GPU ``cluster.gpu: auto``
names, the device ``runtime.device: auto`` takes, and which code packs transfers."""

from __future__ import annotations

import json

import pytest

from nereus.cli import main
from nereus.runtime.execution.packer import TORCH_PACKER, process_packer


def test_inventory_reports_device_choice_and_pack_path(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    assert main(["inventory", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) >= {"nodes", "torch", "device", "cluster_gpu_auto", "pack"}
    assert report["torch"]["torch_build"] in ("cpu", "cuda", "hip")
    node = report["nodes"][0]
    if node["virtual"]:  # no GPU driver here: the CPU, the torch fallback
        assert report["device"]["kind"] == "cpu" and report["cluster_gpu_auto"] == "cpu"
    assert report["pack"].startswith(("torch fallback", "nereus._kernels"))
    assert main(["inventory"]) == 0
    text = capsys.readouterr().out
    assert "runtime.device: auto → " in text and "pack kernels: " in text
    assert "cluster.gpu: auto → " in text


def test_cpu_ranks_pack_with_torch() -> None:
    assert process_packer("cpu") is TORCH_PACKER
