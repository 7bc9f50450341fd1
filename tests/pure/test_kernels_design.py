"""The pack/unpack kernels' one design in two dialects: the shared headers name no vendor API.

Compiling them: ranks/test_kernels_compile.py; running them needs a GPU: gpu/test_kernels_gpu.py.
"""

from __future__ import annotations

import re

from support.kernel_sources import KERNELS, code_of


def test_kernel_design_names_no_vendor_api() -> None:
    """pack_kernel.h, pack_api.h and the binding are vendor-neutral; only nereus_gpu.h maps
    cuda*/hip* names, and both dialect TUs include the same design header."""
    vendor = re.compile(r"\b(cuda|hip)[A-Z_]\w*|__CUDA|__HIP|<cuda|<hip", re.I)
    for name in ("pack_kernel.h", "pack_api.h", "pack_binding.h"):
        hits = vendor.findall(code_of(KERNELS / "common" / name))
        assert not hits, f"{name} names vendor APIs: {hits}"
    gpu_h = code_of(KERNELS / "common" / "nereus_gpu.h")
    assert "hip/hip_runtime.h" in gpu_h and "cuda_runtime.h" in gpu_h
    for tu in (KERNELS / "cuda" / "pack.cu", KERNELS / "hip" / "pack.hip"):
        code = code_of(tu)
        assert '#include "common/nereus_gpu.h"' in code
        assert '#include "common/pack_kernel.h"' in code
        assert "__global__" not in code, f"{tu.name} defines kernels of its own"
