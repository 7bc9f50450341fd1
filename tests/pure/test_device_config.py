"""The configuration of the GPU data plane (pure): ``runtime.device``, ``runtime.inject_oom``,
one-rank jobs, ``runtime.generation: auto`` and ``cluster.gpu: auto``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.paths import REPO as ROOT

from nereus.config.load import load_config, load_raw
from nereus.config.run import RunConfig, parse_runtime, resolve_generation
from nereus.config.schema import parse_config
from nereus.errors import ConfigError
from nereus.spec.hardware import GPU_PRESETS, GpuSpec

GPU_EXAMPLE = ROOT / "examples" / "grpo-tiny-gpu.yaml"
LLAMA_EXAMPLE = ROOT / "examples" / "ppo-llama8b-h200.yaml"
H100 = GpuSpec("nvidia-h100", "nvidia", 80 * 10**9, 989e12, 3350.0, 450.0, 50.0)


def _setup(path: Path = GPU_EXAMPLE) -> Any:
    return load_config(str(path), detect_gpu=lambda: GPU_PRESETS["h200"]).setup


def test_device_choices() -> None:
    setup = _setup()
    for choice in ("auto", "cpu", "cuda"):
        rc, _ = parse_runtime({"device": choice}, setup)
        assert rc.device == choice and RunConfig.from_dict(rc.to_dict()) == rc
    assert parse_runtime({}, setup)[0].device == "auto"
    with pytest.raises(ConfigError) as e:
        parse_runtime({"device": "gpu"}, setup)
    assert e.value.field == "runtime.device" and "auto, cpu, cuda" in e.value.rule


def test_inject_oom_is_checked() -> None:
    setup = _setup()
    rc, _ = parse_runtime({"inject_oom": {"rank": 0, "at_step": 2}}, setup, ranks=1, steps=4)
    assert rc.inject_oom == (0, 2) and RunConfig.from_dict(rc.to_dict()) == rc
    for raw, field in (({"rank": 1, "at_step": 0}, "runtime.inject_oom.rank"),
                       ({"rank": 0, "at_step": 4}, "runtime.inject_oom.at_step"),
                       ({"rank": 0}, "runtime.inject_oom.at_step"),
                       ({"rank": 0, "at_step": 0, "x": 1}, "runtime.inject_oom.x")):
        with pytest.raises(ConfigError) as e:
            parse_runtime({"inject_oom": raw}, setup, ranks=1, steps=4)
        assert e.value.field == field, (raw, e.value)


def test_one_rank_jobs() -> None:
    rc, setup = parse_runtime({}, _setup(), ranks=1)
    assert rc.ranks == 1 and (setup.cluster.nodes, setup.cluster.gpus_per_node) == (1, 1)
    with pytest.raises(ConfigError) as e:
        parse_runtime({}, _setup(), ranks=0)
    assert e.value.field == "--ranks"


def test_generation_auto_resolves_per_hardware() -> None:
    tiny = _setup()  # tiny GPTs: not a Hugging Face architecture vLLM loads
    llama = load_config(str(LLAMA_EXAMPLE)).setup
    assert resolve_generation("auto", False, True, llama)[0] == "megatron"  # CPU ranks
    assert resolve_generation("auto", True, False, llama) == (
        "megatron", "auto: vLLM does not import here")
    assert resolve_generation("auto", True, True, llama)[0] == "vllm"
    engine, why = resolve_generation("auto", True, True, tiny)
    assert engine == "megatron" and why.startswith("auto: ")
    assert resolve_generation("megatron", True, True, llama)[0] == "megatron"
    assert resolve_generation("vllm", False, False, llama)[0] == "vllm"  # checked elsewhere


def test_cluster_gpu_auto_takes_the_detected_gpu_only_when_asked() -> None:
    raw = load_raw(str(GPU_EXAMPLE))
    assert parse_config(raw, detected_gpu=H100).setup.cluster.gpu == H100
    calls: list[int] = []

    def detect() -> GpuSpec:
        calls.append(1)
        return H100

    assert load_config(str(GPU_EXAMPLE), detect_gpu=detect).setup.cluster.gpu.name == \
        "nvidia-h100"
    load_config(str(LLAMA_EXAMPLE), detect_gpu=detect)  # names its GPU: no detection
    assert calls == [1]
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    assert e.value.field == "cluster.gpu" and "inventory" in e.value.rule
    bad = {**raw, "cluster": {**raw["cluster"], "gpu": "h100"}}
    with pytest.raises(ConfigError) as e:
        parse_config(bad)
    assert "allowed: h200, a100-64gb, a100-80gb, h100-80gb, mi250x-gcd, mi300x, cpu, auto" in e.value.rule
