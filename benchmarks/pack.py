"""Shard pack/unpack bandwidth on realistic transfer plans, against a plain copy of the same bytes.

Plans (Llama-3.1-8B, bf16, Megatron-core layouts):

- ``layer-tp4to2``: every weight slice of one decoder layer that a tp2 rank exchanges with its two
  tp4 peers (tp 4 -> 2 merge; the same slices leave a tp2 rank in a 2 -> 4 split): fused QKV
  (whole query groups: row blocks), ``linear_proj`` (row-parallel: column halves, strided),
  gated ``linear_fc1`` ([gate; up]: two row blocks per peer), ``linear_fc2`` (column halves).
  One buffer per peer, 10 slices, 218 MB.
- ``embedding-tp4to2``: the vocab-parallel embedding shard of a tp2 rank (64128 x 4096 of the
  128256 x 4096 table) from its two tp4 peers: one row block each, 525 MB.
- ``norms-65``: all 65 RMSNorm weights of the model (2 per layer, final norm), one buffer of 65
  small slices, 532 kB (an Extend sends these; launch overhead dominates).

Methods, per plan, for pack (slices -> buffer) and unpack (buffer -> slices): ``copy`` (the
baseline: one contiguous device copy of the same bytes per buffer), ``torch`` (the fallback: one
``copy_`` per slice into views of a preallocated buffer) and, on a GPU with ``nereus._kernels``
built, ``kernels`` (one launch per buffer). Bandwidth is bytes moved / s, each byte read once
and written once; every method's result is checked against torch's bytes. Medians of
``--reps`` timed runs after warm-up; CUDA events on a GPU, perf_counter on the CPU.

    python benchmarks/pack.py [--json] [--device cpu|cuda] [--reps N] [--threads N]
                              [--plans a,b] [--tile-bytes 16384,32768]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch

from nereus.kernels.pack import kernels_available, pack, unpack
from nereus.kernels.table import DEFAULT_TILE_BYTES
from nereus.spec.model import LLAMA_3_1_8B, ModelSpec

Box = tuple[tuple[int, int], ...]
Buffer = list[tuple[torch.Tensor, Box]]  # the pieces of one transfer buffer, in order


def _rows(a: int, b: int, cols: int) -> Box:
    return ((a, b), (0, cols))


def _cols(rows: int, a: int, b: int) -> Box:
    return ((0, rows), (a, b))


def layer_tp4to2(m: ModelSpec, device: torch.device, dtype: torch.dtype) -> list[Buffer]:
    """The weight slices of one layer on a tp2 rank, one buffer per tp4 peer."""
    h, ffn = m.hidden_size, m.ffn_hidden_size
    qkv_rows = (m.q_size + 2 * m.kv_size) // 2
    qkv = torch.empty(qkv_rows, h, dtype=dtype, device=device)
    proj = torch.empty(h, m.q_size // 2, dtype=dtype, device=device)
    fc1 = torch.empty(ffn, h, dtype=dtype, device=device)  # [gate half; up half] of tp2
    fc2 = torch.empty(h, ffn // 2, dtype=dtype, device=device)
    buffers: list[Buffer] = []
    for peer in range(2):  # tp4 ranks 2r and 2r+1
        q = qkv_rows // 2
        p = proj.shape[1] // 2
        g = ffn // 4  # a tp4 rank's gate (and up) chunk
        f = fc2.shape[1] // 2
        buffers.append([
            (qkv, _rows(peer * q, (peer + 1) * q, h)),
            (proj, _cols(h, peer * p, (peer + 1) * p)),
            (fc1, _rows(peer * g, (peer + 1) * g, h)),
            (fc1, _rows(ffn // 2 + peer * g, ffn // 2 + (peer + 1) * g, h)),
            (fc2, _cols(h, peer * f, (peer + 1) * f)),
        ])
    return buffers


def embedding_tp4to2(m: ModelSpec, device: torch.device, dtype: torch.dtype) -> list[Buffer]:
    rows = m.vocab_size // 2
    emb = torch.empty(rows, m.hidden_size, dtype=dtype, device=device)
    half = rows // 2
    return [[(emb, _rows(0, half, m.hidden_size))], [(emb, _rows(half, rows, m.hidden_size))]]


def norms(m: ModelSpec, device: torch.device, dtype: torch.dtype) -> list[Buffer]:
    ws = [torch.empty(m.hidden_size, dtype=dtype, device=device) for _ in range(2 * m.num_layers + 1)]
    return [[(w, ((0, m.hidden_size),)) for w in ws]]


PLANS: dict[str, Callable[[ModelSpec, torch.device, torch.dtype], list[Buffer]]] = {
    "layer-tp4to2": layer_tp4to2,
    "embedding-tp4to2": embedding_tp4to2,
    "norms-65": norms,
}


def _nbytes(buf: Buffer) -> int:
    total = 0
    for t, box in buf:
        n = t.element_size()
        for a, b in box:
            n *= b - a
        total += n
    return total


def _time_s(fn: Callable[[], None], device: torch.device, reps: int, warmup: int) -> float:
    """Median seconds of one call of ``fn``."""
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _fill(buffers: list[Buffer], seed: int) -> None:
    g = torch.Generator(device=buffers[0][0][0].device).manual_seed(seed)
    seen: set[int] = set()
    for buf in buffers:
        for t, _ in buf:
            if id(t) not in seen:
                seen.add(id(t))
                t.copy_(torch.randn(t.shape, generator=g, device=t.device, dtype=torch.float32))


def _reference(buf: Buffer) -> torch.Tensor:
    parts = [t[tuple(slice(a, b) for a, b in box)].contiguous().reshape(-1).view(torch.uint8)
             for t, box in buf]
    return torch.cat(parts)


def bench_plan(
    name: str, device: torch.device, reps: int, warmup: int, tile_sizes: list[int], use_kernels: bool
) -> list[dict[str, object]]:
    buffers = PLANS[name](LLAMA_3_1_8B, device, torch.bfloat16)
    _fill(buffers, seed=0)
    nbytes = sum(_nbytes(b) for b in buffers)
    refs = [_reference(b) for b in buffers]
    outs = [torch.empty(r.numel(), dtype=torch.uint8, device=device) for r in refs]
    copy_src = [r.clone() for r in refs]  # real data: untouched pages would read as one zero page

    def copy() -> None:
        for o, s in zip(outs, copy_src, strict=True):
            o.copy_(s)

    # (label, backend, tile bytes)
    methods: list[tuple[str, str, int]] = [("torch", "torch", DEFAULT_TILE_BYTES)]
    if use_kernels:
        for tb in tile_sizes:
            label = "kernels" if len(tile_sizes) == 1 else f"kernels[tile={tb}]"
            methods.append((label, "kernels", tb))

    rows: list[dict[str, object]] = []
    copy_s = _time_s(copy, device, reps, warmup)
    for op in ("pack", "unpack"):
        rows.append({"plan": name, "op": op, "method": "copy", "bytes": nbytes, "time_s": copy_s})
        torch_s = None
        for label, be, tb in methods:
            if op == "pack":
                def run(be: str = be, tb: int = tb) -> None:
                    for b, o in zip(buffers, outs, strict=True):
                        pack(b, out=o, force_backend=be, tile_bytes=tb)
            else:
                def run(be: str = be, tb: int = tb) -> None:
                    for b, r in zip(buffers, refs, strict=True):
                        unpack(r, b, force_backend=be, tile_bytes=tb)
            # poison what the method writes (the plans' slices cover their tensors whole)
            for o in outs:
                o.fill_(0xFF)
            if op == "unpack":
                for b in buffers:
                    for t, _ in b:
                        t.view(torch.uint8).fill_(0xFF)
            t_s = _time_s(run, device, reps, warmup)
            ok = all(torch.equal(o, r) for o, r in zip(outs, refs, strict=True)) if op == "pack" \
                else all(torch.equal(_reference(b), r) for b, r in zip(buffers, refs, strict=True))
            if not ok:
                raise SystemExit(f"{name} {op} {label}: result differs from torch's slicing")
            torch_s = t_s if label == "torch" else torch_s
            rows.append({"plan": name, "op": op, "method": label, "bytes": nbytes, "time_s": t_s})
        for row in rows:
            if row["op"] == op:
                row_s = float(row["time_s"])  # type: ignore[arg-type]
                row["gbps"] = nbytes / row_s / 1e9
                row["vs_copy"] = copy_s / row_s
                row["vs_torch"] = (torch_s / row_s) if torch_s else None
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=0, help="timed runs (default 20 on GPU, 5 on CPU)")
    ap.add_argument("--plans", default=",".join(PLANS), help="comma-separated plan names")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for torch (default: torch's)")
    ap.add_argument("--tile-bytes", default=str(DEFAULT_TILE_BYTES),
                    help="comma-separated kernel tile sizes to compare")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    reps = args.reps or (20 if device.type == "cuda" else 5)
    warmup = 3 if device.type == "cuda" else 1
    use_kernels = device.type == "cuda" and kernels_available()
    tiles = [int(x) for x in args.tile_bytes.split(",")]
    rows: list[dict[str, object]] = []
    for name in args.plans.split(","):
        if name not in PLANS:
            print(f"--plans: unknown plan {name!r} (known: {', '.join(PLANS)})", file=sys.stderr)
            return 2
        rows += bench_plan(name, device, reps, warmup, tiles, use_kernels)
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    for row in rows:
        row["device"] = what
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"device: {what}; kernels: {'yes' if use_kernels else 'no (torch fallback only)'}")
    print(f"{'plan':18} {'op':7} {'method':22} {'MB':>8} {'ms':>9} {'GB/s':>8} {'vs copy':>8} {'vs torch':>9}")
    for r in rows:
        vs_torch = "" if r["vs_torch"] is None else f"{r['vs_torch']:.2f}"
        print(f"{r['plan']:18} {r['op']:7} {r['method']:22} {int(r['bytes']) / 1e6:8.1f} "  # type: ignore[call-overload]
              f"{float(r['time_s']) * 1e3:9.3f} {r['gbps']:8.1f} {r['vs_copy']:8.2f} {vs_torch:>9}")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
