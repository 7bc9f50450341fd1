"""Build script.

Installs the pure-Python package always. When a CUDA or ROCm toolkit is visible to torch it also
builds the optional ``nereus._kernels`` extension (shard pack/unpack, see kernels/); without one
the runtime uses its torch fallback and installation still succeeds.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup


def _kernel_extension() -> dict:
    if os.environ.get("NEREUS_NO_KERNELS"):
        return {}
    try:
        import torch
        from torch.utils import cpp_extension
    except Exception:
        return {}
    here = os.path.dirname(os.path.abspath(__file__))
    if cpp_extension.CUDA_HOME is not None and not getattr(torch.version, "hip", None):
        sources = [os.path.join("kernels", "cuda", f) for f in ("pack_ext.cpp", "pack.cu")]
    elif getattr(torch.version, "hip", None) and cpp_extension.ROCM_HOME is not None:
        sources = [os.path.join("kernels", "hip", f) for f in ("pack_ext.cpp", "pack.hip")]
    else:
        return {}
    if not all(os.path.exists(os.path.join(here, s)) for s in sources):
        return {}
    if os.environ.get("NEREUS_BUILD_KERNELS", "auto") == "auto":
        try:
            if not torch.cuda.is_available() and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
                print("nereus: no GPU visible; set TORCH_CUDA_ARCH_LIST to build kernels", file=sys.stderr)
                return {}
        except Exception:
            return {}
    ext = cpp_extension.CUDAExtension(
        name="nereus._kernels",
        sources=sources,
        include_dirs=[os.path.join(here, "kernels")],
        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"]},
    )
    return {"ext_modules": [ext], "cmdclass": {"build_ext": cpp_extension.BuildExtension}}


setup(**_kernel_extension())
