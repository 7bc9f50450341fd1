"""The DeepSpeed rows of ``benchmarks/resharding.py``: a live ZeRO DP change against DeepSpeed's
Universal Checkpoint restart (UCP), in one run.

A Megatron-core GPTModel inside a DeepSpeed engine (ZeRO stage 1 or 2, fp32, torch Adam) on
gloo CPU ranks; the Adam moments are filled from the weights (exp_avg = 0.1·w, exp_avg_sq = w²,
step 1) so that every byte is distinct state. Per row:

- live: the target unit is built at the new DP (DeepSpeed engine included) and the state
  re-partitioned (:func:`nereus.runtime.execution.zero_executor.change_dp`), timed from the
  first rank starting to the last finishing, in a job of 4 ranks that play GPUs of
  ``DEVICE_BYTES`` as the other rows' ranks do (freed memory kept, touched once at start);
- restart: ``save_checkpoint`` in a job at the source DP holding the same state (timed from its
  barrier, its launch not counted) + ``ds_to_universal`` (a process, 1 worker per stage, as
  documented) + a fresh launch at the target DP (spawn, import, gloo, build, universal load);
- "same": every target rank's partitions (fp32 master, both moments), parameters and Adam step
  hash equal between the two paths;
- bytes moved against the minimum (:func:`nereus.emu.zero.min_bytes`: target values whose GPU
  did not hold them, plus the parameters once per GPU new to the unit).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import socket
import tempfile
import time
import warnings
from datetime import timedelta
from typing import Any

WORLD = 4
# Per rank, as in resharding.py's rows (a CPU rank plays a GPU whose memory exists before the
# job: freed memory is kept and touched once, before any row): the 2→4 row's peak is the dp 2
# source (330 MB of parameters, 495 MB of fp32 master and moments) beside the dp 4 target.
DEVICE_BYTES = 2_000_000_000
ROWS = (((0, 1), (0, 1, 2, 3)), ((0, 1, 2, 3), (0, 1)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, world: int, port: int, out_dir: str, fn_name: str,
           args: tuple[Any, ...]) -> None:
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["LOCAL_RANK"] = str(rank)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timedelta(seconds=600))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    result = globals()[fn_name](rank, world, store, *args)
    dist.barrier()
    with open(os.path.join(out_dir, f"{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    dist.destroy_process_group()


def launch(world: int, fn_name: str, *args: Any) -> tuple[list[Any], float]:
    """``world`` fresh processes running ``fn_name``; (per-rank results, wall seconds)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out_dir:
        t0 = time.perf_counter()
        mp.start_processes(_entry, args=(world, _free_port(), out_dir, fn_name, args),
                           nprocs=world, join=True, start_method="spawn")
        wall_s = time.perf_counter() - t0
        out = []
        for r in range(world):
            with open(os.path.join(out_dir, f"{r}.pkl"), "rb") as f:
                out.append(pickle.load(f))
    return out, wall_s


def _options(stage: int, universal: bool = False) -> Any:
    from ucp_restart import universal_options

    from nereus.engines.deepspeed_engine import DeepSpeedOptions

    opts = DeepSpeedOptions(stage)
    return universal_options(opts) if universal else opts


def _build(model: str, rank: int, ranks: tuple[int, ...], stage: int, *,
           initialize: bool = True, universal: bool = False) -> Any:
    """The unit on ``ranks`` (collective over the job: every rank creates the groups)."""
    import torch.distributed as dist

    from nereus.emu.unit import Emu, Layout
    from nereus.engines.deepspeed_engine import build_zero_unit
    from nereus.runtime.execution.groups import unit_groups
    from nereus.runtime.worker.state import Counters
    from nereus.spec.model import MODEL_PRESETS

    emus = [Emu("actor-train", "s", Layout(1, 1), (r,)) for r in ranks]
    groups = [unit_groups(e, rank, 600.0) for e in emus]
    dp_group = dist.new_group(list(ranks))
    if rank not in ranks:
        return None
    i = ranks.index(rank)
    return build_zero_unit(MODEL_PRESETS[model], emus[i], rank, groups[i], dp_group, ranks,
                           _options(stage, universal), lr=1e-3, initialize=initialize,
                           counters=Counters())


def _fill(unit: Any) -> None:
    import torch

    with torch.no_grad():
        params = unit.params()
        for part in unit.partitions():
            m, v = unit.moment(part.group, "exp_avg"), unit.moment(part.group, "exp_avg_sq")
            for fr in part.fragments:
                w = params[fr.tensor].detach().view(-1)[fr.tensor_start:fr.tensor_stop]
                m[fr.part_start:fr.part_start + fr.numel].copy_(w * 0.1)
                v[fr.part_start:fr.part_start + fr.numel].copy_(w * w)
    unit.set_step(1.0)
    unit.counters.updates = 1


def _digest(unit: Any) -> str:
    h = hashlib.sha256()
    for part in unit.partitions():
        for key in (None, "exp_avg", "exp_avg_sq"):
            t = unit.hp(part.group) if key is None else unit.moment(part.group, key)
            for fr in part.fragments:
                h.update(t[fr.part_start:fr.part_start + fr.numel].detach().numpy().tobytes())
    for name, p in unit.params().items():
        h.update(name.encode())
        h.update(p.detach().numpy().tobytes())
    h.update(repr((unit.step_value(), unit.counters.updates)).encode())
    return h.hexdigest()


def live(rank: int, world: int, store: Any, model: str, stage: int) -> list[dict[str, Any]]:
    """Both rows' live DP changes, one after the other, in one job of ``WORLD`` ranks."""
    import torch.distributed as dist

    from nereus.runtime.execution.zero_executor import change_dp
    from nereus.runtime.worker.host_memory import reserve, retain_freed_memory

    if retain_freed_memory():
        reserve(DEVICE_BYTES)
    out = []
    for i, (src_ranks, dst_ranks) in enumerate(ROWS):
        src = _build(model, rank, src_ranks, stage)
        if src is not None:
            _fill(src)
        dist.barrier()
        t0 = time.perf_counter()
        dst = _build(model, rank, dst_ranks, stage, initialize=False)
        build_s = time.perf_counter() - t0
        change = change_dp(src, dst, src_ranks, dst_ranks, rank, store, f"zero-live/{i}",
                           timeout_s=600.0)
        dist.barrier()
        seconds = time.perf_counter() - t0
        out.append({"seconds": seconds, "build_s": build_s, "transfer_s": change.transfer_s,
                    "bytes_moved": change.plan.bytes_moved, "bytes_min": change.plan.bytes_min,
                    "digest": _digest(dst) if dst is not None else None})
        for u in (src, dst):
            if u is not None:
                u.destroy()
        del src, dst
    return out


def save_job(rank: int, world: int, store: Any, model: str, stage: int,
             path: str) -> float:
    """The source unit (the same state as the live job's) saved by DeepSpeed; seconds."""
    import torch.distributed as dist
    import ucp_restart

    unit = _build(model, rank, tuple(range(world)), stage)
    _fill(unit)
    dist.barrier()
    t0 = time.perf_counter()
    ucp_restart.save(unit, path)
    dist.barrier()
    return time.perf_counter() - t0


def restart_job(rank: int, world: int, store: Any, model: str, stage: int,
                path: str) -> dict[str, Any]:
    """A fresh job at the target DP: build (universal loading) and load; the state's hash."""
    import torch.distributed as dist
    import ucp_restart

    t0 = time.perf_counter()
    unit = _build(model, rank, tuple(range(world)), stage, initialize=False, universal=True)
    build_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    ucp_restart.load(unit, path)
    dist.barrier()
    return {"build_s": build_s, "load_s": time.perf_counter() - t1, "digest": _digest(unit)}


def rows(model: str, stages: tuple[int, ...] = (1,)) -> list[dict[str, Any]]:
    """Every row: live against restart, per ZeRO stage."""
    import ucp_restart

    out = []
    for stage in stages:
        lives, _ = launch(WORLD, "live", model, stage)
        for i, (src_ranks, dst_ranks) in enumerate(ROWS):
            per_rank = [r[i] for r in lives]
            root = tempfile.mkdtemp(prefix="nereus-ucp-")
            try:
                ckpt, uni = os.path.join(root, "ckpt"), os.path.join(root, "universal")
                saves, _ = launch(len(src_ranks), "save_job", model, stage, ckpt)
                save_s = max(saves)
                os.sync()  # the checkpoint's writeback outside every timing
                t0 = time.perf_counter()
                ucp_restart.to_universal(ckpt, uni)
                convert_s = time.perf_counter() - t0
                os.sync()
                loads, launch_s = launch(len(dst_ranks), "restart_job", model, stage, uni)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            live_digests = [per_rank[g]["digest"] for g in dst_ranks]
            seconds = max(r["seconds"] for r in per_rank)
            restart_s = save_s + convert_s + launch_s
            out.append({
                "transition": f"ZeRO-{stage} dp {len(src_ranks)}→{len(dst_ranks)}",
                "bytes_moved": per_rank[0]["bytes_moved"], "bytes_min": per_rank[0]["bytes_min"],
                "seconds": round(seconds, 3), "restart_seconds": round(restart_s, 3),
                "same": live_digests == [r["digest"] for r in loads],
                "build_seconds": round(max(r["build_s"] for r in per_rank), 3),
                "transfer_seconds": round(max(r["transfer_s"] for r in per_rank), 3),
                "save_seconds": round(save_s, 3), "convert_seconds": round(convert_s, 3),
                "launch_seconds": round(launch_s, 3),
                "load_seconds": round(max(r["load_s"] for r in loads), 3),
            })
    return out
