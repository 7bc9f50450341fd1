"""Loading a Hugging Face checkpoint by slices at tp=1, tp=2, pp=2 on CPU ranks and exporting it
back, against transformers' ``from_pretrained`` of the same folder in one process.

The checkpoint: Qwen2.5-0.5B's architecture (24 layers, hidden 896, 14 heads / 2 kv heads,
q/k/v bias, vocabulary 151,936) with untied embeddings (the tied original runs at pp = 1 only
in Nereus), random bf16 weights written here by transformers' ``save_pretrained`` in 500 MB
files: 630 M parameters, 1.26 GB. Made once into ``--dir`` (reused when present).

Per layout, every rank is a fresh process (gloo group of the layout's size): it builds its
unit (Megatron GPTModel stage, fp32 parameters and Adam moments, left unwritten) and reads its
shard (:class:`nereus.hf.load.CheckpointSource`); then it exports the unit
(:func:`nereus.hf.export.write_files`, the runtime's writer) and the export is checked tensor by
tensor against the source. Reported per rank: the bytes read (counted slice by slice) and its
shard's bytes in the file, seconds to build and to read, its shard (the unit's fp32 parameters
and moments), the process baseline (resident memory after imports and the group, before the
unit) and the peak resident memory of the load and of the export (``VmHWM``, reset before each
phase through ``/proc/self/clear_refs``). The baseline: transformers' ``from_pretrained`` in one
fresh process, its default dtype (bf16, the file's) and fp32 (what a Nereus CPU unit holds).

Ratios: the slowest rank's load (build + read) over ``from_pretrained``'s seconds; (peak − its
baseline) over the shard, per rank (goal ≤ 1.2).

    python3 benchmarks/checkpoint_io.py [--dir DIR] [--layouts 1x1,2x1,1x2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

QWEN25_05B_UNTIED = dict(
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
    num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
    rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False, bos_token_id=None,
    eos_token_id=[2, 0], pad_token_id=0)  # the ids of the tokenizer trained here


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:  # resets VmHWM to the current RSS
        fh.write("5")


def make_checkpoint(directory: str, layers: int, vocab: int) -> None:
    """The random bf16 checkpoint (transformers' save_pretrained), written aside then renamed."""
    import torch
    import transformers

    from nereus.tools.tiny_checkpoint import train_tokenizer

    if os.path.isdir(directory):
        return
    cfg = transformers.Qwen2Config(**{**QWEN25_05B_UNTIED, "num_hidden_layers": layers,
                                      "vocab_size": vocab})
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # drawn in bf16: no fp32 copy of the model
    try:
        model = transformers.Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(torch.float32)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(directory)), prefix=".ckio-")
    model.save_pretrained(tmp, max_shard_size="500MB")
    train_tokenizer(400).save_pretrained(tmp)
    os.rename(tmp, directory)


def _hf_baseline(directory: str, dtype: str, out: Any) -> None:
    warnings.filterwarnings("ignore")
    import torch
    import transformers

    torch.set_num_threads(1)
    # transformers imports its model code lazily: imported before the clock starts (Nereus's
    # ranks import Megatron before theirs), as is the config
    transformers.AutoConfig.from_pretrained(directory)
    _ = (transformers.Qwen2ForCausalLM, transformers.AutoModelForCausalLM,
         transformers.GenerationConfig)
    base = _status_kb("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    kw = {} if dtype == "auto" else {"dtype": getattr(torch, dtype)}
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, **kw)
    seconds = time.perf_counter() - t0
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    out.put({"dtype": dtype, "seconds": seconds, "baseline_bytes": base,
             "peak_bytes": _status_kb("VmHWM"), "model_bytes": n})


def _rank(rank: int, world: int, port: int, directory: str, layout: tuple[int, int],
          export_dir: str, out: Any) -> None:
    warnings.filterwarnings("ignore")
    import numpy as np
    import torch
    import torch.distributed as dist

    from nereus.config.checkpoint import role_checkpoint
    from nereus.config.checkpoint_files import read_checkpoint
    from nereus.emu.hf_export import export_plan
    from nereus.emu.shards import shards_at
    from nereus.emu.unit import Emu, Layout
    from nereus.hf.export import DTYPES, RoleExport, write_files
    from nereus.hf.load import CheckpointSource
    from nereus.runtime.execution.groups import unit_groups
    from nereus.runtime.worker.state import new_unit_state

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    ck = role_checkpoint("models.actor", "actor", read_checkpoint("ck", directory))
    lay = Layout(*layout)
    emu = Emu("actor-train", "s", lay, tuple(range(world)))
    groups = unit_groups(emu, rank, 600.0)
    assert groups is not None
    pp_rank, tp_rank = divmod(rank, lay.tp)
    shard = shards_at(ck.spec, lay, pp_rank, tp_rank)
    values = sum(int(np.prod(s.local_shape)) for s in shard)
    dist.barrier()
    base = _status_kb("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    st = new_unit_state(ck.spec, emu, rank, groups, initialize=False)
    t1 = time.perf_counter()
    src = CheckpointSource(ck, 0)
    nbytes = src.fill(st)
    t2 = time.perf_counter()
    load_peak = _status_kb("VmHWM")
    dist.barrier()
    _reset_peak()
    t3 = time.perf_counter()
    files = export_plan(ck.spec, lay, 2, 500_000_000)
    re = RoleExport("actor", "actor-train", ck, "lm_head", DTYPES[ck.dtype])
    written, err = write_files(st, files, export_dir, re)
    t4 = time.perf_counter()
    export_peak = _status_kb("VmHWM")
    dist.barrier()
    out.put({"rank": rank, "bytes_read": nbytes, "shard_file_bytes": values * 2,
             "state_bytes": values * 12, "build_s": t1 - t0, "read_s": t2 - t1,
             "zero_s": src.stats.zero_s,
             "baseline_bytes": base, "load_peak_bytes": load_peak, "export_s": t4 - t3,
             "export_peak_bytes": export_peak, "written_bytes": written, "error": err,
             "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})
    dist.destroy_process_group()


def _spawn(target: Any, args_of: Any, n: int) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of(r), out)) for r in range(n)]
    for p in procs:
        p.start()
    got = [out.get(timeout=3600) for _ in range(n)]
    for p in procs:
        p.join(timeout=120)
        if p.exitcode not in (0, None):
            raise RuntimeError(f"a process exited with {p.exitcode}")
    return got


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _same_as_source(directory: str, export_dir: str) -> bool:
    from safetensors import safe_open

    def tensors(folder: str) -> dict[str, Any]:
        out = {}
        for name in sorted(os.listdir(folder)):
            if name.endswith(".safetensors"):
                with safe_open(os.path.join(folder, name), framework="pt") as fh:
                    for k in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                        out[k] = fh.get_tensor(k)
        return out

    a, b = tensors(directory), tensors(export_dir)
    return a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "nereus-ckio-qwen05b"))
    p.add_argument("--layouts", default="1x1,2x1,1x2", help="tp x pp of each load")
    p.add_argument("--layers", type=int, default=24, help="fewer for a quick check")
    p.add_argument("--vocab", type=int, default=151936, help="smaller for a quick check")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    make_checkpoint(args.dir, args.layers, args.vocab)
    result: dict[str, Any] = {"dir": args.dir, "transformers": [], "layouts": {}}
    for dtype in ("auto", "float32"):
        result["transformers"] += _spawn(_hf_baseline, lambda r, d=dtype: (args.dir, d), 1)
    hf_s = {b["dtype"]: b["seconds"] for b in result["transformers"]}
    for spec in args.layouts.split(","):
        tp, pp = (int(x) for x in spec.split("x"))
        world = tp * pp
        export_dir = tempfile.mkdtemp(prefix=f"ckio-export-{spec}-")
        port = _free_port()
        ranks = sorted(_spawn(_rank, lambda r, port=port, tp=tp, pp=pp, w=world, e=export_dir:
                              (r, w, port, args.dir, (tp, pp), e), world),
                       key=lambda r: r["rank"])
        same = _same_as_source(args.dir, export_dir)
        load_s = max(r["build_s"] + r["read_s"] for r in ranks)
        params_s = max(r["build_s"] + r["read_s"] - r["zero_s"] for r in ranks)
        result["layouts"][spec] = {
            "ranks": ranks, "export_equals_source": same, "load_s": load_s,
            "params_s": params_s, "params_over_hf_fp32": params_s / hf_s["float32"],
            "export_s": max(r["export_s"] for r in ranks),
            "load_over_hf_auto": load_s / hf_s["auto"],
            "load_over_hf_fp32": load_s / hf_s["float32"],
            "peak_over_shard": [(r["load_peak_bytes"] - r["baseline_bytes"]) / r["state_bytes"]
                                for r in ranks],
            "export_peak_over_shard": [(r["export_peak_bytes"] - r["baseline_bytes"])
                                       / r["state_bytes"] for r in ranks],
            "read_equals_shard": all(r["bytes_read"] == r["shard_file_bytes"] for r in ranks)}
        import shutil

        shutil.rmtree(export_dir, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"checkpoint {args.dir}")
    for b in result["transformers"]:
        print(f"  transformers from_pretrained dtype={b['dtype']:8s} {b['seconds']:6.2f} s  "
              f"peak {(b['peak_bytes'] - b['baseline_bytes']) / 1e9:5.2f} GB over a "
              f"{b['baseline_bytes'] / 1e9:.2f} GB baseline (model {b['model_bytes'] / 1e9:.2f} GB)")
    for spec, row in result["layouts"].items():
        print(f"  {spec}: load {row['load_s']:6.2f} s = {row['load_over_hf_auto']:.2f}x "
              f"from_pretrained (bf16), {row['load_over_hf_fp32']:.2f}x (fp32); the parameters "
              f"alone (no Adam moments) {row['params_s']:.2f} s = "
              f"{row['params_over_hf_fp32']:.2f}x (fp32); export "
              f"{row['export_s']:.2f} s, equal to the source: {row['export_equals_source']}; "
              f"bytes read = shard bytes: {row['read_equals_shard']}")
        for r, ratio, eratio in zip(row["ranks"], row["peak_over_shard"],
                                    row["export_peak_over_shard"], strict=True):
            print(f"    rank {r['rank']}: read {r['bytes_read'] / 1e9:.3f} GB, build "
                  f"{r['build_s']:.2f} s + read {r['read_s']:.2f} s (zero moments "
                  f"{r['zero_s']:.2f} s), shard "
                  f"{r['state_bytes'] / 1e9:.2f} GB, baseline {r['baseline_bytes'] / 1e9:.2f} "
                  f"GB, peak over baseline {ratio:.3f}x shard (export {eratio:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
