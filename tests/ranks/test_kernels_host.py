"""The kernels' own device code, run on the CPU (host mode of kernels/common/pack_kernel.h).

kernels/common/pack_host.cpp compiles the same tile partition, slice lookup and vector copy
loops with a plain C++ compiler and runs every block and thread of one launch serially. Fed the
descriptor tables nereus.kernels builds for the GPU, with small tiles so slices span many tiles,
it must produce torch's bytes exactly. Skipped without a C++ compiler.
"""

from __future__ import annotations

import ctypes
import random
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.pack_cases import check_pack, check_roundtrip, check_unpack, random_pieces

from nereus.kernels import table as desc_table
from nereus.kernels.pack import pack, unpack
from nereus.kernels.slices import SliceSpec, row_geometry

REPO = Path(__file__).resolve().parents[2]
CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    if CXX is None:
        pytest.skip("no C++ compiler (c++, g++ or clang++) on PATH")
    so = tmp_path_factory.mktemp("pack_host") / "libnereus_pack_host.so"
    cmd = [CXX, "-std=c++17", "-O2", "-fno-strict-aliasing", "-Wall", "-Wextra", "-Werror",
           "-shared", "-fPIC", "-I", str(REPO / "kernels"),
           str(REPO / "kernels" / "common" / "pack_host.cpp"), "-o", str(so)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    lib = ctypes.CDLL(str(so))
    lib.nereus_pack_host.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                                     ctypes.c_int]
    lib.nereus_pack_host.restype = ctypes.c_int
    return lib


def _launcher(lib: ctypes.CDLL, threads: int, log: list[np.ndarray] | None = None) -> Callable:
    def launch(table: np.ndarray, n_tiles: int, to_tensors: bool) -> None:
        t = np.ascontiguousarray(table, dtype=np.int64)
        if log is not None:
            log.append(t.copy())
        rc = lib.nereus_pack_host(t.ctypes.data, t.shape[0], n_tiles, int(to_tensors), threads)
        assert rc == 0

    return launch


def test_layout_constants_match_the_header(host_lib: ctypes.CDLL) -> None:
    header = (REPO / "kernels" / "common" / "pack_api.h").read_text()
    defines = {}
    for line in header.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "#define" and parts[1].startswith("NEREUS_PACK_"):
            defines[parts[1].removeprefix("NEREUS_PACK_")] = " ".join(parts[2:])
    fields = ["STRIDED_PTR", "PACKED_PTR", "ROW_BYTES", "ROWS", "N1", "N2", "S0", "S1", "S2",
              "SEG_BYTES", "TILES_PER_ROW", "TILE_ROWS", "VEC_BYTES", "FIRST_TILE", "N_TILES",
              "DESC_FIELDS", "LAYOUT_VERSION"]
    for name in fields:
        assert int(defines[name]) == getattr(desc_table, name), name
    assert defines["MAX_TILE_BYTES"] == f"(1 << {desc_table.MAX_TILE_BYTES.bit_length() - 1})"
    assert host_lib.nereus_pack_host_desc_fields() == desc_table.DESC_FIELDS
    assert host_lib.nereus_pack_host_layout_version() == desc_table.LAYOUT_VERSION


@settings(max_examples=120, deadline=None)
@given(
    st.randoms(use_true_random=False),
    st.sampled_from([16, 32, 64, 256, desc_table.DEFAULT_TILE_BYTES]),
    st.sampled_from([1, 3, 32, 256]),
    st.integers(0, 15),
)
def test_host_kernels_pack_and_unpack(host_lib, rng: random.Random, tile_bytes: int,
                                      threads: int, shift: int) -> None:
    kw = {"launch": _launcher(host_lib, threads), "tile_bytes": tile_bytes}
    check_pack(random_pieces(rng), shift=shift, **kw)
    disjoint = random_pieces(rng, disjoint=True)
    check_unpack(disjoint, shift=shift, **kw)
    check_roundtrip(disjoint, **kw)


def test_host_kernels_use_wide_units_and_many_tiles(host_lib: ctypes.CDLL) -> None:
    """A TP column slice and a contiguous block, aligned: 16-byte units, one table, many tiles."""
    w = torch.randn(64, 96, dtype=torch.bfloat16)  # rows of 192 bytes
    pieces = [(w, ((0, 64), (32, 96))), (w, ((8, 16), (0, 96)))]
    log: list[np.ndarray] = []
    launch = _launcher(host_lib, 256, log)
    buf = pack(pieces, launch=launch, tile_bytes=64)
    ref = torch.cat([w[:, 32:96].reshape(-1), w[8:16].reshape(-1)])
    assert torch.equal(buf, ref)
    (table,) = log
    assert table[:, desc_table.VEC_BYTES].tolist() == [16, 16]
    assert table[:, desc_table.ROW_BYTES].tolist() == [128, 8 * 192]
    assert table[:, desc_table.N_TILES].tolist() == [64 * 2, 8 * 192 // 64]
    assert table[:, desc_table.FIRST_TILE].tolist() == [0, 128]
    back = torch.zeros_like(w)
    unpack(buf, [(back, b) for _, b in pieces], launch=launch, tile_bytes=64)
    assert torch.equal(back[:, 32:], w[:, 32:]) and torch.equal(back[8:16], w[8:16])
    assert torch.all(back[:8, :32] == 0) and torch.all(back[16:, :32] == 0)


def test_slices_beyond_three_outer_dims_go_to_the_fallback(host_lib: ctypes.CDLL) -> None:
    base = torch.arange(2 * 3 * 4 * 5 * 2, dtype=torch.float32).reshape(2, 3, 4, 5, 2)
    # base[:2, :2, :2, :2, 1]: no two dims merge and the inner stride is 2, so 4 outer dims
    spec = SliceSpec(0, 1, (120, 40, 10, 2), (2, 2, 2, 2))
    plain = torch.arange(4, dtype=torch.float32)
    log: list[np.ndarray] = []
    buf = pack([base, plain], [spec, SliceSpec(1, 0, (1,), (4,))], launch=_launcher(host_lib, 7, log))
    assert torch.equal(buf[:16], base[:2, :2, :2, :2, 1].reshape(-1))
    assert torch.equal(buf[16:], plain)
    assert log[0].shape[0] == 1  # only the plain slice went through the kernels


def _bench_plans():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_pack", REPO / "benchmarks" / "pack.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.PLANS


@pytest.mark.parametrize("plan", ["layer-tp4to2", "embedding-tp4to2", "norms-65"])
def test_benchmark_plans_through_host_kernels(host_lib: ctypes.CDLL, plan: str) -> None:
    """The benchmark's transfer plans (on medium-gpt shapes) through the kernels' own code."""
    from nereus.spec.model import MODEL_PRESETS

    buffers = _bench_plans()[plan](MODEL_PRESETS["medium-gpt"], torch.device("cpu"), torch.bfloat16)
    seen: set[int] = set()
    for buf in buffers:
        for t, _ in buf:
            if id(t) not in seen:
                seen.add(id(t))
                t.copy_(torch.randn(t.shape))
    kw = {"launch": _launcher(host_lib, 256)}
    for buf in buffers:
        check_pack(buf, **kw)
        check_unpack(buf, shift=2, **kw)


def test_host_mode_flags_units_a_gpu_would_fault_on(host_lib: ctypes.CDLL) -> None:
    """Every access above is checked for alignment to its unit; a table that claims 16-byte units
    on an odd address is reported (return code 2), so the vector-width rule is tested on CPU."""
    src = torch.arange(64, dtype=torch.uint8)
    out = torch.zeros(32, dtype=torch.uint8)
    geometry = row_geometry(SliceSpec(0, 1, (1,), (32,)), 1)
    assert geometry is not None
    copy = desc_table.Copy(src.data_ptr() + 1, out.data_ptr(), geometry)
    table, n_tiles = desc_table.build_table([copy])
    assert table[0, desc_table.VEC_BYTES] == 1
    assert host_lib.nereus_pack_host(table.ctypes.data, 1, n_tiles, 0, 32) == 0
    table[0, desc_table.VEC_BYTES] = 16  # a wrong claim
    assert host_lib.nereus_pack_host(table.ctypes.data, 1, n_tiles, 0, 32) == 2
