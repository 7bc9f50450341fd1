"""Build script.

Installs the pure-Python package always. When a CUDA or ROCm toolkit is visible to torch it also
builds the optional ``nereus._kernels`` extension (shard pack/unpack, see kernels/); without one
the runtime uses its torch fallback and installation still succeeds.

The extension needs torch at build time, so build it without pip's build isolation:
``pip install -e . --no-build-isolation`` or ``python setup.py build_ext --inplace``.
``NEREUS_BUILD_KERNELS``: ``auto`` (default: build when a GPU is visible or
``TORCH_CUDA_ARCH_LIST`` / ``PYTORCH_ROCM_ARCH`` is set), ``1`` (build, fail without a toolkit),
``0`` (never; ``NEREUS_NO_KERNELS=1`` is the same). A ROCm build targets ``PYTORCH_ROCM_ARCH``,
by default ``ROCM_ARCHS`` (gfx90a, gfx942).
"""

from __future__ import annotations

import os
import sys

from setuptools import setup

_COMMON_HEADERS = ("nereus_gpu.h", "pack_api.h", "pack_kernel.h", "pack_binding.h")
# AMD targets of a ROCm build when PYTORCH_ROCM_ARCH is not set (torch's extension builder reads
# it): MI250X (gfx90a) and MI300X (gfx942). slurm/amd.sbatch exports the same list.
ROCM_ARCHS = "gfx90a;gfx942"


def _kernel_extension() -> dict:
    mode = os.environ.get("NEREUS_BUILD_KERNELS", "auto")
    if os.environ.get("NEREUS_NO_KERNELS") or mode == "0":
        return {}
    try:
        import torch
        from torch.utils import cpp_extension
    except Exception as err:
        if mode == "1":
            raise SystemExit(f"nereus: NEREUS_BUILD_KERNELS=1 needs torch to build: {err}") from err
        return {}
    here = os.path.dirname(os.path.abspath(__file__))
    is_hip = bool(getattr(torch.version, "hip", None))
    if not is_hip and cpp_extension.CUDA_HOME is not None:
        sources = [os.path.join("kernels", "cuda", f) for f in ("pack_ext.cpp", "pack.cu")]
    elif is_hip and cpp_extension.ROCM_HOME is not None:
        sources = [os.path.join("kernels", "hip", f) for f in ("pack_ext.cpp", "pack.hip")]
        os.environ.setdefault("PYTORCH_ROCM_ARCH", ROCM_ARCHS)
    else:
        if mode == "1":
            raise SystemExit("nereus: NEREUS_BUILD_KERNELS=1 but torch sees no CUDA or ROCm toolkit")
        return {}
    if not all(os.path.exists(os.path.join(here, s)) for s in sources):
        return {}
    if mode == "auto":
        arch_set = os.environ.get("TORCH_CUDA_ARCH_LIST") or os.environ.get("PYTORCH_ROCM_ARCH")
        try:
            if not torch.cuda.is_available() and not arch_set:
                print("nereus: no GPU visible; set TORCH_CUDA_ARCH_LIST to build kernels", file=sys.stderr)
                return {}
        except Exception:
            return {}
    ext = cpp_extension.CUDAExtension(
        name="nereus._kernels",
        sources=sources,
        include_dirs=[os.path.join(here, "kernels")],
        depends=[os.path.join("kernels", "common", h) for h in _COMMON_HEADERS],
        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"]},
    )
    return {"ext_modules": [ext], "cmdclass": {"build_ext": cpp_extension.BuildExtension}}


setup(**_kernel_extension())
