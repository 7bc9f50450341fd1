"""The pack kernels' host mode: the same device code run on the CPU (effectful: a C++ build).

``kernels/common/pack_host.cpp`` compiles the design of ``kernels/common/pack_kernel.h`` — tile
partition, slice lookup, vectorized copy loops — with a plain C++ compiler and runs every block
and thread of one launch serially, checking every access for the alignment a GPU would fault on.
:func:`host_launch` turns the library into the ``launch`` that :func:`nereus.kernels.pack.pack`
and the runtime's :class:`nereus.runtime.execution.packer.Packer` take, so the CPU tests drive
the executor's transfers through the kernels' own code (the GPU build runs it on device).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from nereus.errors import NereusError

TableLaunch = Callable[[np.ndarray, int, bool], None]
MISALIGNED = 2  # pack_host.cpp: some access was not aligned to its unit


class KernelsUnavailable(NereusError):
    """The kernels' sources or a C++ compiler are missing, or the build failed."""


def kernels_dir() -> Path:
    """The ``kernels/`` folder of this checkout (beside the package)."""
    return Path(__file__).resolve().parents[2] / "kernels"


def compiler() -> str | None:
    return shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def build_host_library(out_dir: str | None = None) -> Path:
    """Compile ``pack_host.cpp`` once per source content (cached by hash in ``out_dir``, default
    the temporary directory); returns the shared library's path."""
    src_dir = kernels_dir()
    src = src_dir / "common" / "pack_host.cpp"
    headers = sorted((src_dir / "common").glob("*.h"))
    if not src.exists():
        raise KernelsUnavailable(f"no kernel sources at {src_dir} (a source checkout has them)")
    cxx = compiler()
    if cxx is None:
        raise KernelsUnavailable("no C++ compiler (c++, g++ or clang++) on PATH")
    digest = hashlib.sha256()
    for path in (src, *headers):
        digest.update(path.read_bytes())
    where = Path(out_dir or tempfile.gettempdir())
    where.mkdir(parents=True, exist_ok=True)
    lib = where / f"libnereus_pack_host-{digest.hexdigest()[:16]}.so"
    if lib.exists():
        return lib
    tmp = where / f".{lib.name}.{os.getpid()}"
    cmd = [cxx, "-std=c++17", "-O2", "-fno-strict-aliasing", "-Wall", "-Wextra", "-Werror",
           "-shared", "-fPIC", "-I", str(src_dir), str(src), "-o", str(tmp)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    except subprocess.CalledProcessError as e:
        raise KernelsUnavailable(f"building the host mode failed: {e.stderr.strip()[:300]}"
                                 ) from None
    except (OSError, subprocess.TimeoutExpired) as e:
        raise KernelsUnavailable(f"building the host mode failed: {e}") from None
    os.replace(tmp, lib)  # atomic: ranks building at once all end with a complete library
    return lib


def load_host_library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.nereus_pack_host.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                     ctypes.c_int, ctypes.c_int]
    lib.nereus_pack_host.restype = ctypes.c_int
    return lib


def host_launch(lib: ctypes.CDLL, threads: int = 256) -> TableLaunch:
    """The kernels' launch over a descriptor table, run by the host mode with ``threads``
    threads per block; an access a GPU would fault on raises."""

    def launch(table: np.ndarray, n_tiles: int, to_tensors: bool) -> None:
        t = np.ascontiguousarray(table, dtype=np.int64)
        rc = lib.nereus_pack_host(t.ctypes.data, t.shape[0], n_tiles, int(to_tensors), threads)
        if rc == MISALIGNED:
            raise KernelsUnavailable("host mode: an access was not aligned to its unit "
                                     "(a GPU would fault)")
        if rc != 0:
            raise KernelsUnavailable(f"host mode: launch failed with status {rc}")

    return launch
