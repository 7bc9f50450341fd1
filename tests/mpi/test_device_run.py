"""``nereus run`` of the GPU example on this machine's CPU (mpi marker): one rank, the device
selection logged, an out-of-memory error turned into an urgent replan with the step redone,
``runtime.device: cuda`` without a GPU refused in one line.

The example (examples/grpo-tiny-gpu.yaml) names ``cluster.gpu: auto``: on a node without a GPU
the inventory finds none and the job runs on CPU ranks — the same code paths a GPU rank takes,
with gloo, fp32 and the torch packer chosen from the environment.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.paths import REPO as ROOT

pytestmark = [pytest.mark.mpi, pytest.mark.skipif(shutil.which("mpiexec") is None,
                                                  reason="needs mpiexec (the mpi extra)")]

EXAMPLE = ROOT / "examples" / "grpo-tiny-gpu.yaml"


def nereus(*args: str, timeout_s: float = 400.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nereus", *args], capture_output=True,
                          text=True, timeout=timeout_s, cwd=ROOT)


def _variant(tmp: Path, name: str, runtime_lines: str) -> Path:
    text = EXAMPLE.read_text()
    assert "\nruntime:\n" in text
    p = tmp / name
    p.write_text(text.replace("\nruntime:\n", "\nruntime:\n" + runtime_lines))
    return p


def _events(log: Path) -> list[tuple[int, str, dict]]:
    from nereus.log.reader import read_run_log

    ev = read_run_log(log).tables["events"]
    return [(int(s), str(k), d) for s, k, d in zip(ev["step"], ev["kind"], ev["detail"],
                                                  strict=True)]


@pytest.mark.timeout(900)
def test_out_of_memory_becomes_an_urgent_replan_and_the_step_is_redone(tmp_path: Path) -> None:
    base_log, oom_log = tmp_path / "base.h5", tmp_path / "oom.h5"
    base = nereus("run", str(EXAMPLE), "--ranks", "1", "--steps", "3", "--log", str(base_log),
                  "--json")
    assert base.returncode == 0, base.stderr[-3000:]
    cfg = _variant(tmp_path, "oom.yaml", "  inject_oom: {rank: 0, at_step: 1}\n")
    res = nereus("run", str(cfg), "--ranks", "1", "--steps", "3", "--log", str(oom_log),
                 "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "step 2 stopped (out of device memory) and runs again" in res.stderr
    want = json.loads(base.stdout.strip().splitlines()[-1])
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["steps"] == 3
    # nothing of the stopped step was kept: the redone step samples and learns the same
    np.testing.assert_allclose(got["rewards"], want["rewards"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(got["lengths"], want["lengths"], rtol=0, atol=1e-12)

    from nereus.log.reader import read_run_log

    run = read_run_log(oom_log)
    assert run.closed and list(run.steps["step"]) == [0, 1, 2]  # no row for the stopped step
    events = _events(oom_log)
    ooms = [d for s, k, d in events if k == "oom"]
    assert len(ooms) == 1 and ooms[0]["fatal"] and ooms[0]["source"] == "allocator"
    assert ooms[0]["model_stage"] == "actor-gen" and ooms[0]["global_rank"] == 0
    assert ooms[0]["peak_bytes"] > ooms[0]["capacity_bytes"]
    assert [(s, d["step"]) for s, k, d in events if k == "step-redone"] == [(1, 1)]
    replans, adm = run.tables["replans"], run.tables["admissions"]
    memory = [int(k) for k, t in zip(replans["step"], replans["trigger"], strict=True)
              if "memory" in str(t).split(",")]
    assert memory == [1], memory  # one replan on memory, at the redone step's boundary
    paths = {int(k): str(p) for k, p in zip(adm["step"], adm["path"], strict=True)}
    assert paths[1] == "urgent", paths
    devices = [d for _, k, d in events if k == "devices"]
    assert devices and devices[0]["rank0"]["kind"] == "cpu"
    assert devices[0]["default_backend"] == "gloo" and devices[0]["pack"] == "torch"
    assert devices[0]["generation"] == "megatron"


def _cpu_torch() -> bool:
    import torch

    return not (torch.version.cuda or getattr(torch.version, "hip", None))


@pytest.mark.skipif(not _cpu_torch(), reason="torch has a GPU build here")
def test_device_cuda_without_a_gpu_is_one_line(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    cfg = tmp_path / "cuda.yaml"
    cfg.write_text(text.replace("  device: auto", "  device: cuda"))
    assert "device: cuda" in cfg.read_text()
    res = nereus("run", str(cfg), "--ranks", "1", "--log", str(tmp_path / "x.h5"))
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("nereus: ")]
    assert lines == ["nereus: error: runtime.device='cuda': no GPU for this rank: torch is a "
                     "CPU build (no CUDA or ROCm)"], res.stderr[-2000:]
    assert "Traceback" not in res.stderr
