"""Compile-only checks of the pack/unpack kernels: CUDA (nvcc, sm_90) and HIP (hipcc, gfx90a).

Each is skipped, with the reason, when its compiler is absent. Running them needs a GPU; see
benchmarks/device_check_pack.sh and tests/gpu/test_kernels_gpu.py. (The design's vendor
neutrality, read from the sources: pure/test_kernels_design.py.)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from support.kernel_sources import KERNELS, code_of

REPO = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc")
HIPCC = shutil.which("hipcc")
CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def cuda_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kernels/cuda/pack.cu compiled for sm_90 (object and kept PTX) in a temporary folder."""
    if NVCC is None:
        pytest.skip("nvcc not on PATH (CUDA toolkit absent)")
    out = tmp_path_factory.mktemp("pack_cuda")
    _run([NVCC, "-arch=sm_90", "-O3", "-Xcompiler", "-fPIC", "-Werror", "all-warnings", "--keep",
          "--keep-dir", str(out), "-I", str(KERNELS), "-c", str(KERNELS / "cuda" / "pack.cu"),
          "-o", str(out / "pack.o")])
    return out


def test_cuda_kernels_compile_for_sm90_with_128bit_accesses(cuda_build: Path) -> None:
    assert (cuda_build / "pack.o").stat().st_size > 0
    ptx = "".join(p.read_text() for p in cuda_build.glob("*.ptx"))
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


def test_cuda_launch_bounds_are_threads_and_blocks_per_sm(cuda_build: Path) -> None:
    """CUDA's __launch_bounds__(threads, blocks): .maxntid and .minnctapersm in the PTX."""
    ptx = "".join(p.read_text() for p in cuda_build.glob("*.ptx"))
    assert ".maxntid 256, 1, 1" in ptx and ".minnctapersm 3" in ptx


def _hip_device_ir(arch: str, out: Path) -> str:
    env = {**os.environ, "HIP_PLATFORM": "amd"}
    assert HIPCC is not None
    _run([HIPCC, f"--offload-arch={arch}", "--cuda-device-only", "-emit-llvm", "-S", "-O3",
          "-I", str(KERNELS), str(KERNELS / "hip" / "pack.hip"), "-o", str(out)], env=env)
    return out.read_text()


@pytest.mark.skipif(HIPCC is None, reason="hipcc not on PATH (apt-get install hipcc)")
@pytest.mark.parametrize("arch,wave,waves_per_eu", [("gfx90a", 64, 3), ("gfx1030", 32, 6)])
def test_hip_launch_bounds_mean_the_same_blocks_per_cu(tmp_path: Path, arch: str, wave: int,
                                                       waves_per_eu: int) -> None:
    """HIP's second __launch_bounds__ argument is waves per SIMD (amdgpu-waves-per-eu), not
    CUDA's blocks per multiprocessor: 3 blocks of 256 threads per compute unit (4 SIMDs) are
    3 waves per SIMD on wave64 CDNA (MI250X) and 6 on wave32 RDNA."""
    ir = _hip_device_ir(arch, tmp_path / f"pack_{arch}.ll")
    assert '"amdgpu-flat-work-group-size"="1,256"' in ir
    assert f'"amdgpu-waves-per-eu"="{waves_per_eu}"' in ir
    assert waves_per_eu == -(-3 * 256 // (4 * wave))


def _rocm_archs() -> list[str]:
    m = re.search(r'^ROCM_ARCHS = "([^"]+)"', (REPO / "setup.py").read_text(), re.M)
    assert m is not None
    return m.group(1).split(";")


@pytest.mark.skipif(HIPCC is None, reason="hipcc not on PATH (apt-get install hipcc)")
@pytest.mark.parametrize("arch", _rocm_archs())
def test_hip_kernels_compile_for_the_default_rocm_archs(tmp_path: Path, arch: str) -> None:
    """setup.py's default PYTORCH_ROCM_ARCH (slurm/amd.sbatch's too): each target compiles, or
    is skipped when this hipcc predates it (Debian's 5.2.3 knows gfx90a, not gfx942)."""
    env = {**os.environ, "HIP_PLATFORM": "amd"}
    assert HIPCC is not None
    out = tmp_path / f"pack_{arch}.o"
    proc = subprocess.run([HIPCC, f"--offload-arch={arch}", "-O3", "-Werror", "-I",
                           str(KERNELS), "-c", str(KERNELS / "hip" / "pack.hip"), "-o",
                           str(out)], capture_output=True, text=True, timeout=300, env=env)
    if proc.returncode != 0 and f"invalid target ID '{arch}'" in proc.stderr:
        pytest.skip(f"this hipcc does not know {arch}: {proc.stderr.strip().splitlines()[0]}")
    assert proc.returncode == 0, proc.stderr
    assert arch.encode() in out.read_bytes()


def _cudart_dir() -> Path | None:
    if NVCC is None:
        return None
    home = Path(NVCC).resolve().parent.parent
    for lib in ("lib64", "lib", "targets/x86_64-linux/lib"):
        if (home / lib / "libcudart.so").exists():
            return home / lib
    return None


@pytest.mark.skipif(CXX is None, reason="no C++ compiler on PATH")
def test_torch_binding_builds_and_imports(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The CUDA build of nereus._kernels, compiled and linked here against the CPU torch's
    libraries: it imports, reports its layout, and refuses a descriptor table off the GPU.
    Without nvcc and libcudart only the binding is compiled (syntax check)."""
    torch_ext = pytest.importorskip("torch.utils.cpp_extension")
    import torch

    from nereus.kernels import table as desc_table

    assert CXX is not None
    includes = [f"-I{p}" for p in torch_ext.include_paths()]
    includes += [f"-I{sysconfig.get_paths()['include']}", f"-I{KERNELS}"]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    flags = ["-std=c++20", "-DTORCH_EXTENSION_NAME=_kernels", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    binding = str(KERNELS / "cuda" / "pack_ext.cpp")
    # both builds use the one binding: the HIP build's file is the same one-include TU
    assert code_of(KERNELS / "cuda" / "pack_ext.cpp").strip() == '#include "common/pack_binding.h"'
    assert code_of(KERNELS / "hip" / "pack_ext.cpp").strip() == '#include "common/pack_binding.h"'
    cudart = _cudart_dir()
    if cudart is None:
        _run([CXX, *flags, "-fsyntax-only", *includes, binding])
        return
    kernels_o = request.getfixturevalue("cuda_build") / "pack.o"
    _run([CXX, *flags, "-O0", "-fPIC", *includes, "-c", binding, "-o", str(tmp_path / "pack_ext.o")])
    torch_lib = Path(torch.__file__).parent / "lib"
    so = tmp_path / "_kernels.so"
    _run([CXX, "-shared", str(kernels_o), str(tmp_path / "pack_ext.o"), f"-L{torch_lib}",
          "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", f"-L{cudart}", "-lcudart",
          f"-Wl,-rpath,{torch_lib}", f"-Wl,-rpath,{cudart}", "-o", str(so)])
    probe = (
        "import importlib.util, sys, torch\n"
        f"spec = importlib.util.spec_from_file_location('nereus._kernels', {str(so)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "print(m.DIALECT, m.LAYOUT_VERSION, m.DESC_FIELDS)\n"
        "try:\n"
        "    m.pack(torch.zeros(1, m.DESC_FIELDS, dtype=torch.int64), 1, 0)\n"
        "except RuntimeError as e:\n"
        "    print('refused:', str(e).splitlines()[0])\n"
    )
    out = _run([sys.executable, "-c", probe]).stdout.splitlines()
    assert out[0] == f"cuda {desc_table.LAYOUT_VERSION} {desc_table.DESC_FIELDS}"
    assert out[1] == "refused: nereus pack: descriptor table must be on the GPU"


def test_setup_without_a_toolkit_installs_pure_python_and_forcing_fails_loudly() -> None:
    """On a CPU build of torch setup.py plans no extension; NEREUS_BUILD_KERNELS=1 refuses."""
    torch = pytest.importorskip("torch")
    if torch.version.cuda or getattr(torch.version, "hip", None):
        pytest.skip("torch has a GPU build here: setup.py would build the extension")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEREUS_")}
    probe = ("import sys; sys.argv = ['setup.py', '--version']; import runpy; "
             "runpy.run_path('setup.py', run_name='__main__')")
    plain = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip().splitlines()[-1] == "0.1.0"
    forced = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                            env={**env, "NEREUS_BUILD_KERNELS": "1"}, timeout=120)
    assert forced.returncode != 0
    assert "sees no CUDA or ROCm toolkit" in forced.stderr
