"""Compile-only checks of the pack/unpack kernels: CUDA (nvcc, sm_90) and HIP (hipcc, gfx90a).

Each is skipped, with the reason, when its compiler is absent. Running them needs a GPU; see
benchmarks/device_check_pack.sh and tests/test_kernels_gpu.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KERNELS = REPO / "kernels"
NVCC = shutil.which("nvcc")
HIPCC = shutil.which("hipcc")
CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH (CUDA toolkit absent)")
def test_cuda_kernels_compile_for_sm90_with_128bit_accesses(tmp_path: Path) -> None:
    assert NVCC is not None
    src = str(KERNELS / "cuda" / "pack.cu")
    _run([NVCC, "-arch=sm_90", "-O3", "-Werror", "all-warnings", "-I", str(KERNELS), "-c", src,
          "-o", str(tmp_path / "pack.o")])
    _run([NVCC, "-arch=sm_90", "-O3", "-I", str(KERNELS), "-ptx", src, "-o", str(tmp_path / "pack.ptx")])
    ptx = (tmp_path / "pack.ptx").read_text()
    assert ".entry" in ptx and "nereus_pack_kernel" in ptx
    assert re.search(r"ld\.global(\.nc)?\.v4\.(u|b)32", ptx), "no 128-bit loads in the PTX"
    assert re.search(r"st\.global\.v4\.(u|b)32", ptx), "no 128-bit stores in the PTX"


@pytest.mark.skipif(HIPCC is None, reason="hipcc not on PATH (apt-get install hipcc)")
def test_hip_kernels_compile_for_gfx90a(tmp_path: Path) -> None:
    assert HIPCC is not None
    env = {**os.environ, "HIP_PLATFORM": "amd"}
    out = tmp_path / "pack_hip.o"
    _run([HIPCC, "--offload-arch=gfx90a", "-O3", "-Werror", "-I", str(KERNELS), "-c",
          str(KERNELS / "hip" / "pack.hip"), "-o", str(out)], env=env)
    blob = out.read_bytes()
    assert b"gfx90a" in blob, "the object carries no gfx90a code object"


@pytest.mark.skipif(CXX is None, reason="no C++ compiler on PATH")
def test_torch_binding_compiles_against_torch_headers(tmp_path: Path) -> None:
    """Syntax check of the binding shared by both builds (it needs only torch's CPU headers)."""
    torch_ext = pytest.importorskip("torch.utils.cpp_extension")
    assert CXX is not None
    includes = [f"-I{p}" for p in torch_ext.include_paths()]
    includes += [f"-I{sysconfig.get_paths()['include']}", f"-I{KERNELS}"]
    _run([CXX, "-std=c++20", "-fsyntax-only", "-DTORCH_EXTENSION_NAME=_kernels", *includes,
          str(KERNELS / "cuda" / "pack_ext.cpp")])
    # both builds use the one binding: the HIP build's file is the same one-include TU
    assert _code(KERNELS / "cuda" / "pack_ext.cpp").strip() == '#include "common/pack_binding.h"'
    assert _code(KERNELS / "hip" / "pack_ext.cpp").strip() == '#include "common/pack_binding.h"'


def _code(path: Path) -> str:
    text = path.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def test_kernel_design_names_no_vendor_api() -> None:
    """pack_kernel.h, pack_api.h and the binding are vendor-neutral; only nereus_gpu.h maps
    cuda*/hip* names, and both dialect TUs include the same design header."""
    vendor = re.compile(r"\b(cuda|hip)[A-Z_]\w*|__CUDA|__HIP|<cuda|<hip", re.I)
    for name in ("pack_kernel.h", "pack_api.h", "pack_binding.h"):
        hits = vendor.findall(_code(KERNELS / "common" / name))
        assert not hits, f"{name} names vendor APIs: {hits}"
    gpu_h = _code(KERNELS / "common" / "nereus_gpu.h")
    assert "hip/hip_runtime.h" in gpu_h and "cuda_runtime.h" in gpu_h
    for tu in (KERNELS / "cuda" / "pack.cu", KERNELS / "hip" / "pack.hip"):
        code = _code(tu)
        assert '#include "common/nereus_gpu.h"' in code
        assert '#include "common/pack_kernel.h"' in code
        assert "__global__" not in code, f"{tu.name} defines kernels of its own"
