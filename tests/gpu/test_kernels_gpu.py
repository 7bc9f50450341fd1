"""GPU check of the compiled kernels (nereus._kernels) against torch, every byte checked.

Random slices of random CUDA tensors, outputs poisoned with 0x00 and 0xFF, buffers shifted off
16-byte alignment, tile sizes from 16 bytes (over a million tiles: the blocks' grid-stride loop)
to the default, and the benchmark's realistic plans. Skipped without a CUDA device or without
the extension; benchmarks/device_check_pack.sh builds it and runs this file. Runs without
pytest too (``python tests/gpu/test_kernels_gpu.py``), since a bare GPU image may lack it.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for support (run as a script)
from support.pack_cases import (
    check_pack,
    check_roundtrip,
    check_unpack,
    random_pieces,
    random_tensor,
    reference_pack,
    tensor_bytes,
)

from nereus.kernels.pack import (
    backend,
    kernels_available,
    pack,
    pack_views,
    unpack,
    unpack_views,
)
from nereus.kernels.table import DEFAULT_TILE_BYTES

try:
    import pytest
except ImportError:  # the plain runner below
    pytest = None  # type: ignore[assignment]


class _Skip(Exception):
    pass


_PLAIN_RUNNER = False  # set by _main: skip by exception rather than through pytest


def _require() -> None:
    reason = None
    if not torch.cuda.is_available():
        reason = "no CUDA device"
    elif not kernels_available():
        reason = "nereus._kernels not built (benchmarks/device_check_pack.sh builds it)"
    if reason is not None:
        if pytest is None or _PLAIN_RUNNER:
            raise _Skip(reason)
        pytest.skip(reason)


if pytest is not None:
    pytestmark = pytest.mark.gpu

KERNELS = {"force_backend": "kernels"}


def test_gpu_tensors_choose_the_kernels() -> None:
    _require()
    assert backend(torch.device("cuda")) == "kernels"
    t = torch.arange(64, dtype=torch.float32, device="cuda").reshape(8, 8)
    assert torch.equal(pack([(t, ((0, 8), (2, 4)))]), t[:, 2:4].reshape(-1))
    views = [t[:, 2:4], t[5:7], t.t()[1:3]]  # the runtime hook's form
    buf = pack_views(views)
    assert torch.equal(buf, torch.cat([v.reshape(-1) for v in views]))
    dest = torch.zeros_like(t)
    unpack_views(buf[:32], [dest[:, 4:6], dest[:, 0:2]])  # disjoint destinations
    assert torch.equal(dest[:, 4:6].reshape(-1), buf[:16]) and torch.equal(dest[:, 0:2].reshape(-1), buf[16:32])


def test_random_slices_match_torch() -> None:
    _require()
    rng = random.Random(20261201)
    for _ in range(300):
        tile = rng.choice([16, 64, 4096, DEFAULT_TILE_BYTES])
        kw = {**KERNELS, "tile_bytes": tile}
        check_pack(random_pieces(rng, device="cuda", max_dim=9), shift=rng.randint(0, 15), **kw)
        disjoint = random_pieces(rng, device="cuda", max_dim=9, disjoint=True)
        check_unpack(disjoint, shift=rng.randint(0, 15), **kw)
        check_roundtrip(disjoint, **kw)
    torch.cuda.synchronize()


def test_large_slices_and_grid_stride() -> None:
    """Long rows over many tiles, short strided rows, and > 2^20 tiles in one launch."""
    _require()
    w = random_tensor((4096, 7168), torch.bfloat16, 1, "cuda")  # fc2 of a tp2 rank
    emb = random_tensor((8192, 4096), torch.bfloat16, 2, "cuda")
    pieces = [(w, ((0, 4096), (3584, 7168))), (emb, ((100, 8000), (0, 4096))),
              (w, ((7, 9), (5, 7)))]
    for tile in (16, DEFAULT_TILE_BYTES):
        check_pack(pieces, shift=0, tile_bytes=tile, **KERNELS)
        check_pack(pieces, shift=6, tile_bytes=tile, **KERNELS)
        check_unpack(pieces, shift=10, tile_bytes=tile, **KERNELS)
    torch.cuda.synchronize()


def test_runs_on_the_current_stream_and_reuses_tables() -> None:
    _require()
    t = torch.randn(512, 1024, dtype=torch.float16, device="cuda")
    pieces = [(t, ((0, 512), (0, 256))), (t, ((0, 512), (768, 1024)))]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        first = pack(pieces)
        t.add_(1)  # after the first pack, on the same stream
        second = pack(pieces)  # the same table (same addresses): served from the cache
    side.synchronize()
    assert torch.equal(second, first + 1)
    assert torch.equal(tensor_bytes(second), reference_pack(pieces))
    dest = torch.zeros_like(t)
    unpack(second, [(dest, b) for _, b in pieces])
    assert torch.equal(dest[:, :256], t[:, :256]) and torch.equal(dest[:, 768:], t[:, 768:])
    assert torch.all(dest[:, 256:768] == 0)


def _main() -> int:
    global _PLAIN_RUNNER
    _PLAIN_RUNNER = True
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    passed = failed = skipped = 0
    for name, fn in tests:
        try:
            fn()
            passed += 1
            print(f"PASS {name}")
        except _Skip as s:
            skipped += 1
            print(f"SKIP {name}: {s}")
        except Exception as e:  # report every test, then fail
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_main())
