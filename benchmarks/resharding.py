"""Live resharding (Split / Merge / Extend / Destroy over gloo) against checkpoint/restart.

A Megatron-core GPTModel (default ``medium-gpt``: 82.6 M parameters, 248 M values with Adam)
over 8 CPU ranks. Per transition: bytes moved against the minimum (bytes whose owner changes),
seconds of the live transition (building the target Megatron models included) against two
checkpoint/restarts — *cold*: torch DCP save in the running job + a fresh launch of 8 processes
that import, initialise, build the target layout and load; *warm*: the same save + building the
target layout and loading the checkpoint in processes that are already running (no start-up) —
and the achieved transfer bandwidth against the aggregate bandwidth of the same directed pairs
of ranks sending at once (measured right before the row: every pair the row's transfer plans
use sends 128 MiB concurrently, best of 3), the ceiling of that row's traffic pattern. The
one-pair bandwidth (the median of measurements at the start and before every row) is kept as
a second reference ("1-pair").

The bandwidth counts the bytes moved over the network seconds: from posting the transfers to
the last one completed (strided halves unpacked included). On these CPU ranks the moves inside
a rank (Split's own half) run after that, as :func:`nereus.runtime.execution.torch_executor.execute_plan` does
on CPU; "+local" is the fraction with them included (on a GPU they run beside the transfers,
in device memory). ``--json`` rows: transition, bytes_moved, bytes_min, seconds,
restart_seconds (cold), warm_restart_seconds, pairs, pairs_gbps, p2p_fraction (against
pairs_gbps), one_pair_fraction, p2p_gbps, transfer_seconds, network_seconds.

DeepSpeed rows (``benchmarks/zero_rows.py``, when the deepspeed package imports): a ZeRO unit's
live DP change 2→4 and 4→2 on 4 ranks against DeepSpeed's Universal Checkpoint restart
(save_checkpoint → ds_to_universal → load at the new DP in fresh processes), same state checked
by hash; ``--json`` puts them under ``deepspeed_rows``.

    python3 benchmarks/resharding.py [--json] [--model medium-gpt] [--deepspeed on|off|only]
        [--zero-stages 1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORLD = 8
# Per rank. The largest row (Split tp 2→1) holds 1.47 GB of tensors at its peak; with the
# receive buffers of strided halves and the heap's fragmentation a rank's heap reached ~1.75 GB
# (a 1.6 GB reserve was exceeded: RSS grew past it and the Split paid page faults, 1.25-1.40 s
# of transfer instead of 0.90-1.05 s in a probe of that row alone). The peak RSS is reported.
# (RESHARDING_DEVICE_BYTES overrides it: a smaller reserve for a quick run of a small model.)
DEVICE_BYTES = int(os.environ.get("RESHARDING_DEVICE_BYTES", 2_000_000_000))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _init(rank: int, port: int) -> Any:
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0, timedelta(seconds=600))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=600))
    return store


def _entry(rank: int, port: int, out_dir: str, fn_name: str, args: tuple[Any, ...]) -> None:
    import pickle

    import torch.distributed as dist

    store = _init(rank, port)
    result = globals()[fn_name](rank, store, *args)
    dist.barrier()
    with open(os.path.join(out_dir, f"{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    dist.destroy_process_group()


def _launch(fn_name: str, *args: Any) -> tuple[list[Any], float]:
    """Start 8 fresh processes running ``fn_name``; (per-rank results, wall seconds)."""
    import pickle

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out_dir:
        t0 = time.perf_counter()
        mp.start_processes(_entry, args=(_free_port(), out_dir, fn_name, args), nprocs=WORLD,
                           join=True, start_method="spawn")
        wall_s = time.perf_counter() - t0
        out = []
        for r in range(WORLD):
            with open(os.path.join(out_dir, f"{r}.pkl"), "rb") as f:
                out.append(pickle.load(f))
    return out, wall_s


def _units(dp: int, tp: int, pp: int, first_gpu: int = 0) -> list[Any]:
    from nereus.emu.unit import Emu, Layout

    size = tp * pp
    return [Emu("actor-train", "s", Layout(tp, pp),
                tuple(range(first_gpu + i * size, first_gpu + (i + 1) * size)))
            for i in range(dp)]


def _fill(ex: Any) -> None:
    """Adam moments derived from the (seeded, replica-identical) Megatron initial weights."""
    import torch

    with torch.no_grad():
        for st in ex.units.values():
            t = st.tensors()
            for k, p in t["param"].items():
                t["exp_avg"][k].copy_(p * 0.1)
                t["exp_avg_sq"][k].copy_(p * p)


def _trim() -> None:
    """Drop the previous row's units (their memory stays with the rank, as on a GPU)."""
    import gc

    gc.collect()


def _p2p(rank: int, store: Any, n_values: int, tag: str = "") -> float:
    """Seconds of the best of 3 sends of ``n_values`` fp32 from rank 0 to rank 1 (gloo)."""
    import torch
    import torch.distributed as dist

    from nereus.runtime.execution.groups import transition_group

    best = float("inf")
    for i in range(3):
        if rank in (0, 1):
            g = transition_group(store, f"p2p{tag}{i}", (0, 1), rank, 120.0)
            buf = torch.full((n_values,), float(rank))
            t0 = time.perf_counter()
            if rank == 0:
                g.pg.send([buf], 1, 0).wait()
            else:
                g.pg.recv([buf], 0, 0).wait()
            best = min(best, time.perf_counter() - t0)
        dist.barrier()
    return best


def _p2p_pairs(rank: int, store: Any, n_values: int) -> float:
    """Seconds for 4 concurrent pairs (r → r+4) each sending ``n_values`` fp32 (best of 3)."""
    import torch
    import torch.distributed as dist

    from nereus.runtime.execution.groups import transition_group

    best = float("inf")
    for i in range(3):
        pair = (rank % 4, rank % 4 + 4)
        g = transition_group(store, f"pairs{i}-{pair[0]}", pair, rank, 120.0)
        buf = torch.full((n_values,), float(rank))
        dist.barrier()
        t0 = time.perf_counter()
        if rank < 4:
            g.pg.send([buf], 1, 0).wait()
        else:
            g.pg.recv([buf], 0, 0).wait()
        dist.barrier()
        best = min(best, time.perf_counter() - t0)
    return best


def row_pairs(plans: list[Any]) -> list[tuple[int, int]]:
    """The directed GPU pairs a row's transfer plans send bytes over (local copies excluded)."""
    return sorted({(m.src_gpu, m.dst_gpu) for plan in plans for m in plan.moves
                   if m.src_gpu != m.dst_gpu})


def _pairs_p2p(rank: int, store: Any, pairs: list[tuple[int, int]], n_values: int,
               tag: str) -> float:
    """Seconds (best of 3, barrier to barrier) for every directed pair of ``pairs`` to send
    ``n_values`` fp32 at once: the ceiling a row moving bytes over these pairs can reach."""
    import torch
    import torch.distributed as dist

    from nereus.runtime.execution.groups import transition_group

    best = float("inf")
    mine = [(a, b) for a, b in pairs if rank in (a, b)]
    for i in range(3):
        groups = {}
        for a, b in sorted({(min(p), max(p)) for p in mine}):
            groups[(a, b)] = transition_group(store, f"agg{tag}{i}-{a}-{b}", (a, b), rank, 120.0)
        bufs = [(a, b, torch.full((n_values,), float(rank))) for a, b in mine]
        dist.barrier()
        t0 = time.perf_counter()
        works = []
        for a, b, buf in bufs:
            g = groups[(min(a, b), max(a, b))]
            direction = 0 if a < b else 1  # both directions of a pair share its group
            if rank == a:
                works.append(g.pg.send([buf], g.group_rank(b), direction))
            else:
                works.append(g.pg.recv([buf], g.group_rank(a), direction))
        for w in works:
            w.wait()
        dist.barrier()
        best = min(best, time.perf_counter() - t0)
    return best


def _timed(ex: Any, fn: Any) -> tuple[float, float, float]:
    """Live seconds of ``fn``; its transfer seconds (local copies included) and network
    seconds (until the last transfer completed) on this rank."""
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    ex.last_transfer_s = ex.last_network_s = 0.0
    fn()
    dist.barrier()
    return time.perf_counter() - t0, ex.last_transfer_s, ex.last_network_s


def bench(rank: int, store: Any, model: str, ckpt_root: str) -> dict[str, Any]:
    """The live transitions, in one job; saves a checkpoint before each (timed separately)."""
    import torch.distributed as dist

    from nereus.emu.primitives import Destroy, extend_node, merge_node, split_node
    from nereus.emu.unit import Layout
    from nereus.runtime.execution.dcp_restart import save_units
    from nereus.runtime.execution.torch_executor import TorchExecutor
    from nereus.runtime.worker.host_memory import reserve, retain_freed_memory
    from nereus.spec.model import MODEL_PRESETS

    spec = MODEL_PRESETS[model]
    # Each rank plays a GPU of DEVICE_BYTES, as nereus run's CPU ranks do: freed memory is kept
    # and the device's memory is touched once here, before any row is timed.
    reserve_s = reserve(DEVICE_BYTES) if retain_freed_memory() else 0.0
    ex = TorchExecutor(spec, rank, store, "bench", timeout_s=600.0)
    out: dict[str, Any] = {"p2p_s": _p2p(rank, store, 32 * 2**20),
                           "pairs_s": _p2p_pairs(rank, store, 32 * 2**20), "rows": [],
                           "reserve_s": reserve_s}
    out["rss_start_bytes"] = _rss_bytes()

    def start(units: list[Any]) -> None:
        ex.units.clear()
        _trim()
        for u in units:
            ex.create(u)
        _fill(ex)

    def row(name: str, ops: list[Any], run: Any) -> None:
        path = os.path.join(ckpt_root, f"row{len(out['rows'])}")
        dist.barrier()
        t0 = time.perf_counter()
        writers = [sorted(ex.units)[0] if rank == 0 else None]  # rank 0's first unit writes
        dist.broadcast_object_list(writers, src=0)
        save_units(path, list(ex.units.values()), writers[0])
        dist.barrier()
        save_s = time.perf_counter() - t0
        # The checkpoint's dirty pages are written back before the live row, outside both
        # timings: else the kernel's writeback competes with the transition for the 2 cores
        # (the composite row, right after a 1 GB save, measured 1.38 s of transfer against
        # 0.76-1.01 s in a probe without the save).
        os.sync()
        # the one-pair bandwidth right before the row (the run's figure: the median of these)
        p2p_s = _p2p(rank, store, 32 * 2**20, f"row{len(out['rows'])}-")
        pairs = row_pairs([ex.plan_of(op) for op in ops if not isinstance(op, Destroy)])
        pairs_s = _pairs_p2p(rank, store, pairs, 32 * 2**20, f"row{len(out['rows'])}-") \
            if pairs else 0.0
        seconds, transfer_s, network_s = _timed(ex, run)
        out["rows"].append({"transition": name, "save_s": save_s, "seconds": seconds,
                            "transfer_s": transfer_s, "network_s": network_s, "p2p_s": p2p_s,
                            "pairs": pairs, "pairs_s": pairs_s,
                            "bytes_moved": sum(ex.plan_of(op).bytes_moved for op in ops
                                               if not isinstance(op, Destroy)),
                            "bytes_min": sum(ex.plan_of(op).bytes_min for op in ops
                                             if not isinstance(op, Destroy)),
                            "targets": sorted(ex.units), "path": path})

    src = _units(2, 2, 1)
    start(src)
    # one new replica from each existing one (as the DAG's broadcast heap assigns donors)
    ext = [extend_node(src[0], tuple(range(4, 6))), extend_node(src[1], tuple(range(6, 8)))]
    row("Extend dp 2→4 (tp2)", ext, lambda: ex.concurrent(ext))
    live = src + [x.new for x in ext]
    des = [Destroy(u, 0) for u in live[2:]]

    def destroy_all() -> None:
        for d in des:
            ex.destroy(d, live)

    row("Destroy dp 4→2 (tp2)", des, destroy_all)
    spl = [split_node(u, Layout(1, 1)) for u in src]
    row("Split tp 2→1 (dp 2→4)", spl, lambda: ex.concurrent(spl))
    parts = [s.into for s in spl]
    mer = [merge_node(list(p), Layout(2, 1)) for p in parts]
    row("Merge tp 1→2 (dp 4→2)", mer, lambda: ex.concurrent(mer))
    start(_units(4, 1, 2))
    pp_src = _units(4, 1, 2)
    mpp = [merge_node(pp_src[i:i + 2], Layout(1, 4)) for i in (0, 2)]
    row("Merge pp 2→4 (dp 4→2)", mpp, lambda: ex.concurrent(mpp))
    start(_units(4, 2, 1))
    c1 = _units(4, 2, 1)
    cm = [merge_node(c1[i:i + 2], Layout(4, 1)) for i in (0, 2)]
    row("(4,2,1)→(2,4,1)", cm, lambda: ex.concurrent(cm))
    start(_units(2, 2, 2))
    c2 = _units(2, 2, 2)
    cs = [split_node(u, Layout(2, 1)) for u in c2]
    cmm = [merge_node(list(s.into), Layout(4, 1)) for s in cs]

    def split_then_merge() -> None:
        ex.concurrent(cs)
        split_s = ex.last_transfer_s, ex.last_network_s
        ex.concurrent(cmm)  # local copies only
        ex.last_transfer_s, ex.last_network_s = split_s

    row("(2,2,2)→(2,4,1)", cs + cmm, split_then_merge)
    out["rss_peak_bytes"] = _rss_bytes()
    return out


def _rss_bytes() -> int:
    """This process's peak resident set so far (ru_maxrss is in KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def split_modes(rank: int, store: Any, model: str) -> list[dict[str, Any]]:
    """Split tp 2→1 of two tp2 units on ranks 0-3 as pairwise sends vs one gloo all-gather per
    block, twice each, in a job of its own (the all-gather's buffers need several GB that the
    main job's device reserve leaves no room for); no reserve, the same conditions for both."""
    from nereus.emu.primitives import split_node
    from nereus.emu.unit import Layout
    from nereus.runtime.execution.torch_executor import TorchExecutor
    from nereus.spec.model import MODEL_PRESETS

    spec = MODEL_PRESETS[model]
    ex = TorchExecutor(spec, rank, store, "modes", timeout_s=600.0)
    src = _units(2, 2, 1)
    out = []
    for allgather in (False, True, False, True):
        ex.units.clear()
        _trim()
        for u in src:
            ex.create(u)
        _fill(ex)
        ex.split_allgather = allgather
        sp = [split_node(u, Layout(1, 1)) for u in src]
        seconds, transfer_s, _ = _timed(ex, lambda sp=sp: ex.concurrent(sp))
        out.append({"allgather": allgather, "seconds": seconds, "transfer_s": transfer_s})
    return out


def restart(rank: int, store: Any, model: str, path: str, targets: list[Any]) -> dict[str, float]:
    """A fresh job: build the target layout (no random init) and load the checkpoint."""
    import torch.distributed as dist

    from nereus.runtime.execution.dcp_restart import load_units
    from nereus.runtime.execution.torch_executor import TorchExecutor
    from nereus.spec.model import MODEL_PRESETS

    t0 = time.perf_counter()
    ex = TorchExecutor(MODEL_PRESETS[model], rank, store, "restart", timeout_s=600.0)
    for u in targets:
        ex.create(u, initialize=False)
    build_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    load_units(path, list(ex.units.values()))
    dist.barrier()
    return {"build_s": build_s, "load_s": time.perf_counter() - t1}


def warm_restarts(rank: int, store: Any, model: str, rows: list[tuple[str, list[Any]]]
                  ) -> list[dict[str, float]]:
    """The restart without process start-up: in processes already running (with the same
    device reserve as the live job), per row build the target layout (no random init) and load
    its checkpoint with DCP (:func:`~nereus.runtime.execution.dcp_restart.load_units`)."""
    import torch.distributed as dist

    from nereus.runtime.execution.dcp_restart import load_units
    from nereus.runtime.execution.torch_executor import TorchExecutor
    from nereus.runtime.worker.host_memory import reserve, retain_freed_memory
    from nereus.spec.model import MODEL_PRESETS

    if retain_freed_memory():
        reserve(DEVICE_BYTES)
    ex = TorchExecutor(MODEL_PRESETS[model], rank, store, "warm", timeout_s=600.0)
    out = []
    for path, targets in rows:
        ex.units.clear()
        _trim()
        dist.barrier()
        t0 = time.perf_counter()
        for u in targets:
            ex.create(u, initialize=False)
        build_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        load_units(path, list(ex.units.values()))
        dist.barrier()
        out.append({"build_s": build_s, "load_s": time.perf_counter() - t1,
                    "seconds": time.perf_counter() - t0})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--model", default="medium-gpt")
    ap.add_argument("--deepspeed", choices=("on", "off", "only"), default="on",
                    help="the DeepSpeed ZeRO rows (on: after the others, if deepspeed imports)")
    ap.add_argument("--zero-stages", default="1", help="ZeRO stages of the DeepSpeed rows")
    args = ap.parse_args(argv)
    if args.deepspeed == "only":
        return _deepspeed_rows(args)
    from nereus.spec.model import MODEL_PRESETS

    spec = MODEL_PRESETS[args.model]
    ckpt_root = tempfile.mkdtemp(prefix="nereus-resharding-")
    try:
        results, job_s = _launch("bench", args.model, ckpt_root)
        res0 = results[0]
        p2p_bytes = 32 * 2**20 * 4
        # One pair's bandwidth, best of 3 sends of 128 MiB, taken at the start and right before
        # every row; the run's figure is their median: single measurements moved from 2.17 to
        # 4.02 GB/s within one quiet run (RESULTS.md), a row's ratio to its own would carry that.
        row_gbps = [p2p_bytes / max(res["rows"][i]["p2p_s"] for res in results[:2]) / 1e9
                    for i in range(len(res0["rows"]))]
        first_gbps = p2p_bytes / max(r["p2p_s"] for r in results[:2]) / 1e9
        p2p_gbps = statistics.median([first_gbps, *row_gbps])
        pairs_gbps = 4 * p2p_bytes / max(r["pairs_s"] for r in results) / 1e9
        warm, _ = _launch("warm_restarts", args.model,
                          [(r["path"], r["targets"]) for r in res0["rows"]])
        rows = []
        for i, r in enumerate(res0["rows"]):
            per_rank = [res["rows"][i] for res in results]
            seconds = max(x["seconds"] for x in per_rank)
            transfer_s = max(x["transfer_s"] for x in per_rank)
            network_s = max(x["network_s"] for x in per_rank)
            save_s = max(x["save_s"] for x in per_rank)
            timings, launch_s = _launch("restart", args.model, r["path"], r["targets"])
            restart_s = save_s + launch_s
            warm_s = save_s + max(w[i]["seconds"] for w in warm)
            # the ceiling of this row: the same directed pairs sending at once (best of 3)
            npairs = len(r["pairs"])
            agg_s = max(x["pairs_s"] for x in per_rank)
            agg_gbps = npairs * p2p_bytes / agg_s / 1e9 if npairs and agg_s else 0.0
            moved = r["bytes_moved"]
            achieved = moved / network_s / 1e9 if moved and network_s else 0.0
            with_local = moved / transfer_s / 1e9 if moved and transfer_s else 0.0
            rows.append({
                "transition": r["transition"], "bytes_moved": moved,
                "bytes_min": r["bytes_min"], "seconds": round(seconds, 3),
                "restart_seconds": round(restart_s, 3),
                "warm_restart_seconds": round(warm_s, 3),
                "pairs": npairs, "pairs_gbps": round(agg_gbps, 3),
                "p2p_fraction": round(achieved / agg_gbps, 3) if moved and agg_gbps else None,
                "one_pair_fraction": round(achieved / p2p_gbps, 3) if moved else None,
                "p2p_gbps": round(row_gbps[i], 3),
                "transfer_seconds": round(transfer_s, 3), "network_seconds": round(network_s, 3),
                "_save_s": save_s, "_load_s": max(t["load_s"] for t in timings),
                "_with_local": with_local / agg_gbps if moved and agg_gbps else None,
                "_warm_load_s": max(w[i]["load_s"] for w in warm),
                "_pairs_fraction": achieved / pairs_gbps if moved else None,
            })
        mode_results, _ = _launch("split_modes", args.model)
        modes: dict[str, dict[str, float]] = {}
        for i, m in enumerate(mode_results[0]):
            name = "allgather" if m["allgather"] else "pairwise"
            secs = max(res[i]["seconds"] for res in mode_results)
            xfer = max(res[i]["transfer_s"] for res in mode_results)
            best = modes.setdefault(name, {"seconds": secs, "transfer_s": xfer})
            best["seconds"] = min(best["seconds"], secs)
            best["transfer_s"] = min(best["transfer_s"], xfer)
    finally:
        shutil.rmtree(ckpt_root, ignore_errors=True)
    table = sys.stderr if args.json else sys.stdout  # --json: the table goes to stderr
    if args.json:
        print(json.dumps({"rows": [{k: v for k, v in r.items() if not k.startswith("_")}
                                   for r in rows],
                          "model": spec.name, "ranks": WORLD, "p2p_gbps": round(p2p_gbps, 3),
                          "p2p_4pairs_gbps": round(pairs_gbps, 3),
                          "device_reserve_bytes": DEVICE_BYTES,
                          "rss_peak_bytes": max(r["rss_peak_bytes"] for r in results),
                          "split_modes": {k: {n: round(v, 3) for n, v in d.items()}
                                          for k, d in modes.items()}}))
    print(f"{spec.name}: {spec.num_params() / 1e6:.1f} M params, {WORLD} gloo CPU ranks; "
          f"gloo p2p {p2p_gbps:.2f} GB/s (one pair, 128 MiB, median of {len(rows) + 1} "
          f"measurements; row p2p GB/s: the one before it), {pairs_gbps:.2f} GB/s aggregate "
          f"(4 concurrent pairs); live job {job_s:.0f} s", file=table)
    start_rss = max(r["rss_start_bytes"] for r in results)
    peak_rss = max(r["rss_peak_bytes"] for r in results)
    print(f"device reserve {DEVICE_BYTES / 1e9:.1f} GB per rank: peak RSS "
          f"{start_rss / 1e9:.2f} GB after the reserve, {peak_rss / 1e9:.2f} GB at the end "
          f"(grew {(peak_rss - start_rss) / 1e9:.2f} GB past the reserve on some rank)",
          file=table)
    print(f"{'transition':28} {'moved MB':>9} {'min MB':>8} {'live s':>7} {'cold s':>7} "
          f"{'speedup':>8} {'warm s':>7} {'speedup':>8} {'pairs':>5} {'agg GB/s':>8} "
          f"{'p2p frac':>8} {'+local':>6} {'1-pair':>6}  "
          "(save s / cold load s / warm load s / transfer s / network s)", file=table)
    for r in rows:
        frac = "-" if r["p2p_fraction"] is None else f"{r['p2p_fraction']:.2f}"
        local = "-" if r["_with_local"] is None else f"{r['_with_local']:.2f}"
        one = "-" if r["one_pair_fraction"] is None else f"{r['one_pair_fraction']:.2f}"
        print(f"{r['transition']:28} {r['bytes_moved'] / 1e6:9.1f} {r['bytes_min'] / 1e6:8.1f} "
              f"{r['seconds']:7.2f} {r['restart_seconds']:7.2f} "
              f"{r['restart_seconds'] / r['seconds']:7.1f}x {r['warm_restart_seconds']:7.2f} "
              f"{r['warm_restart_seconds'] / r['seconds']:7.1f}x {r['pairs']:5d} "
              f"{r['pairs_gbps']:8.2f} {frac:>8} {local:>6} {one:>6}  "
              f"({r['_save_s']:.2f} / {r['_load_s']:.2f} / {r['_warm_load_s']:.2f} / "
              f"{r['transfer_seconds']:.2f} / {r['network_seconds']:.2f})", file=table)
    split_bytes = next(r["bytes_moved"] for r in rows if r["transition"].startswith("Split"))
    for name, d in modes.items():
        print(f"Split tp 2→1 as {name:9}: live {d['seconds']:.2f} s, transfer {d['transfer_s']:.2f} s "
              f"({split_bytes / d['transfer_s'] / 1e9:.2f} GB/s)", file=table)
    if args.deepspeed == "on":
        return _deepspeed_rows(args)
    return 0


def _deepspeed_rows(args: argparse.Namespace) -> int:
    """The DeepSpeed ZeRO rows (skipped with a note when deepspeed is not installed)."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        print("DeepSpeed rows skipped: the deepspeed package is not installed "
              "(pip install 'nereus[deepspeed]')", file=sys.stderr)
        return 0
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import zero_rows

    stages = tuple(int(x) for x in args.zero_stages.split(","))
    rows = zero_rows.rows(args.model, stages)
    table = sys.stderr if args.json else sys.stdout
    if args.json:
        print(json.dumps({"deepspeed_rows": rows, "model": args.model,
                          "ranks": zero_rows.WORLD}))
    print(f"DeepSpeed ZeRO units, {args.model}, {zero_rows.WORLD} gloo CPU ranks: live DP "
          "change vs Universal Checkpoint restart", file=table)
    print(f"{'transition':20} {'moved MB':>9} {'min MB':>8} {'live s':>7} {'restart s':>9} "
          f"{'speedup':>8} {'same':>5}  (build / transfer | save / convert / launch+load s)",
          file=table)
    for r in rows:
        print(f"{r['transition']:20} {r['bytes_moved'] / 1e6:9.1f} {r['bytes_min'] / 1e6:8.1f} "
              f"{r['seconds']:7.2f} {r['restart_seconds']:9.2f} "
              f"{r['restart_seconds'] / r['seconds']:7.1f}x {r['same']!s:>5}  "
              f"({r['build_seconds']:.2f} / {r['transfer_seconds']:.2f} | {r['save_seconds']:.2f} "
              f"/ {r['convert_seconds']:.2f} / {r['launch_seconds']:.2f})", file=table)
    return 0 if all(r["same"] and r["bytes_moved"] == r["bytes_min"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
