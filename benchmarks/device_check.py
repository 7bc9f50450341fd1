"""The device check of the GPU data plane (issue 19), driven by benchmarks/device_check.sh.

    python3 benchmarks/device_check.py --out DIR [--dry-run] [--parts a,b,c]

(a) pack kernels: nereus._kernels built, every byte of random slices checked against torch with
    poisoned outputs (tests/gpu/test_kernels_gpu.py), bandwidth against a device copy of the same
    bytes (benchmarks/pack.py; goal >= 0.90 on the layer and embedding plans);
(b) nereus run of examples/grpo-tiny-gpu.yaml: 1 rank on the GPU (generation, training, weight
    sync, the allocator's peaks, an induced out-of-memory error turned into an urgent replan
    with the step redone) and 4 ranks sharing the GPU over the host transport with forced
    transitions (Split/Merge/Extend on CUDA tensors staged through pinned host buffers); a
    Destroyed unit's memory given back to the device;
(c) one training step on CUDA against the same step on CPU, fp32 both (TF32 off): equal loss
    and gradients within the tolerance stated below; bf16 (the run's precision) reported.

Writes DIR/device_check.json (one summary) and DIR/device_check.log. ``--dry-run`` checks the
prerequisites and runs every part on the CPU (the kernels' host mode, CPU ranks, CPU against
CPU), so the script itself is tested where no GPU is.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "grpo-tiny-gpu.yaml"
LOG: list[str] = []
# (c): fp32 on both sides, TF32 off: the same arithmetic, summed in a different order (cuBLAS
# against the CPU BLAS, Megatron's schedule against ours). A dot product of K fp32 terms then
# differs by at most ~K·2^-24 relative (K <= 512 here: 3e-5); the loss (a mean over tokens)
# far less. Gradients: |Δ| <= 1e-4·max|g| + 1e-7 per tensor; loss: relative 1e-5.
GRAD_RTOL, GRAD_ATOL, LOSS_RTOL = 1e-4, 1e-7, 1e-5


def say(text: str) -> None:
    LOG.append(text)
    print(text, flush=True)


def run(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    say("$ " + " ".join(cmd))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                         env={**os.environ, **(env or {})})
    tail = (res.stdout[-2000:] + res.stderr[-4000:]).strip()
    if tail:
        LOG.append(tail)
    return res


# ---------------------------------------------------------------- prerequisites

# What transformers 5's tokenizer path imports (found here by loading the pattern task's
# tokenizer in an empty virtual environment with --no-deps installs): the run reads its tokenizer.
TOKENIZER_WHEELS = ("transformers tokenizers huggingface_hub safetensors regex tqdm "
                    "typing-extensions httpx2 httpcore2 h11 idna filelock truststore")

def prerequisites(dry_run: bool) -> dict[str, Any]:
    """What each part needs, found or not; ``carry`` says what to bring to a bare GPU image."""
    import importlib.util

    out: dict[str, Any] = {}

    def have(mod: str) -> bool:
        return importlib.util.find_spec(mod) is not None

    import torch

    out["python"] = sys.version.split()[0]
    out["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                    "hip": getattr(torch.version, "hip", None),
                    "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    out["modules"] = {m: have(m) for m in ("megatron.core", "mpi4py", "h5py", "yaml", "numpy",
                                           "packaging", "transformers", "tokenizers")}
    mpiexec = shutil.which("mpiexec")
    version = ""
    if mpiexec:
        with contextlib.suppress(Exception):
            version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                                     timeout=30).stdout.splitlines()[0]
    out["mpiexec"] = {"path": mpiexec, "version": version, "ulfm": _ulfm(version)}
    out["nvcc"] = shutil.which("nvcc") or (
        str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
        if (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc").exists()
        else None)
    out["cxx"] = shutil.which("c++") or shutil.which("g++")
    # transformers and tokenizers: nereus run reads the task's tokenizer (nereus/rl/data)
    missing = [m for m in ("megatron.core", "mpi4py", "h5py", "yaml", "packaging",
                           "transformers", "tokenizers") if not out["modules"][m]]
    if not mpiexec:
        missing.append("mpiexec (Open MPI)")
    if not dry_run and not torch.cuda.is_available():
        missing.append("a CUDA device")
    if not dry_run and not out["nvcc"]:
        missing.append("nvcc (CUDA toolkit, for part a)")
    if dry_run and not out["cxx"]:
        missing.append("a C++ compiler (the kernels' host mode)")
    out["missing"] = missing
    out["carry"] = ("the missing wheels in .carry/wheels (pip download megatron-core==0.16.1 "
                    "pyyaml packaging " + TOKENIZER_WHEELS + " --no-deps --only-binary=:all: "
                    "--python-version 3.12 --platform manylinux_2_28_x86_64 --platform "
                    "manylinux2014_x86_64 -d .carry/wheels, 23 MB); "
                    "run with carry=['.carry']; torch, NCCL, mpi4py and h5py are in the H200 "
                    "image")
    return out


def _ulfm(version: str) -> bool:
    m = re.search(r"Open MPI\)? (\d+)\.", version) or re.search(r"(\d+)\.\d+\.\d+", version)
    return "Open MPI" in version and m is not None and int(m.group(1)) >= 5


# ---------------------------------------------------------------- (a) pack kernels

def part_a(out: Path, dry_run: bool) -> dict[str, Any]:
    if dry_run:
        return _part_a_host()
    env = {"NEREUS_BUILD_KERNELS": "1", "TORCH_CUDA_ARCH_LIST":
           os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0"), "MAX_JOBS": "16"}
    t0 = time.time()
    b = run([sys.executable, "setup.py", "build_ext", "--inplace"], 300, env)
    res: dict[str, Any] = {"build_s": round(time.time() - t0, 1), "built": b.returncode == 0}
    if b.returncode != 0:
        return {**res, "ok": False, "why": "build failed"}
    t = run([sys.executable, "tests/gpu/test_kernels_gpu.py"], 180)
    skipped = "SKIP" in t.stdout + t.stderr
    res["correct"] = t.returncode == 0 and not skipped
    bench = out / "pack_bench.json"
    p = run([sys.executable, "benchmarks/pack.py", "--json", "--tile-bytes", "32768,65536"], 240)
    rows = json.loads(p.stdout) if p.returncode == 0 else []
    bench.write_text(json.dumps(rows))
    res["bandwidth"] = _best_of(rows)
    goal = [v for k, v in res["bandwidth"].items() if not k.startswith("norms")]
    res["goal_0.90_met"] = bool(goal) and all(v["kernel_vs_copy"] >= 0.90 for v in goal)
    res["ok"] = res["correct"] and res["goal_0.90_met"]
    with contextlib.suppress(OSError):
        bench.unlink()  # summarised above; the folder brings back few files
    return res


def _best_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per plan and op: copy and kernel GB/s, the best kernel tile's share of the copy."""
    out: dict[str, Any] = {}
    for plan in dict.fromkeys(r["plan"] for r in rows):
        for op in ("pack", "unpack"):
            rs = [r for r in rows if r["plan"] == plan and r["op"] == op]
            copy = next((r for r in rs if r["method"] == "copy"), None)
            kern = [r for r in rs if r["method"].startswith("kernels")]
            if copy is None or not kern:
                continue
            best = max(kern, key=lambda r: r["vs_copy"])
            out[f"{plan}/{op}"] = {"copy_gbps": round(copy["gbps"], 1),
                                   "kernel_gbps": round(best["gbps"], 1),
                                   "kernel_vs_copy": round(best["vs_copy"], 3),
                                   "method": best["method"]}
    return out


def _part_a_host() -> dict[str, Any]:
    """Dry run: the kernels' device code in host mode on random slices, outputs poisoned."""
    import random

    sys.path.insert(0, str(ROOT / "tests"))
    from support.pack_cases import check_pack, check_roundtrip, check_unpack, random_pieces

    from nereus.kernels.host_mode import build_host_library, host_launch, load_host_library

    launch = host_launch(load_host_library(build_host_library()), threads=32)
    rng = random.Random(19)
    cases = 0
    for _ in range(12):
        kw = {"launch": launch, "tile_bytes": rng.choice([64, 256, 32768])}
        check_pack(random_pieces(rng), shift=rng.randrange(16), **kw)
        disjoint = random_pieces(rng, disjoint=True)
        check_unpack(disjoint, shift=rng.randrange(16), **kw)
        check_roundtrip(disjoint, **kw)
        cases += 3
    return {"mode": "host (CPU)", "cases": cases, "correct": True, "ok": True}


# ---------------------------------------------------------------- (b) nereus run

FORCED = """  force_transitions:
    - {at_step: 0, layouts: {actor-train: [2, 1]}}
    - {at_step: 1, layouts: {actor-train: [1, 2]}}
    - {at_step: 2, layouts: {actor-train: [1, 1]}}
"""


def _config(out: Path, name: str, lines: str) -> Path:
    text = EXAMPLE.read_text()
    p = out / name
    p.write_text(text.replace("\nruntime:\n", "\nruntime:\n" + lines))
    return p


def _launch(cfg: Path, ranks: int, steps: int, log: Path, summary: Path, ulfm: bool,
            timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``nereus run`` where mpiexec has ULFM (Open MPI 5); else the same rank program under the
    image's mpiexec (what nereus run starts after its checks)."""
    if ulfm:
        return run([sys.executable, "-m", "nereus", "run", str(cfg), "--ranks", str(ranks),
                    "--steps", str(steps), "--log", str(log), "--json"], timeout_s)
    return run(["mpiexec", "--allow-run-as-root", "--oversubscribe", "-n", str(ranks),
                sys.executable, "-m", "nereus.runtime.worker.main", "--config", str(cfg),
                "--log", str(log), "--ranks", str(ranks), "--steps", str(steps),
                "--summary-json", str(summary)], timeout_s,
               {"OMP_NUM_THREADS": "2", "PYTHONWARNINGS": "ignore"})


def _read(log: Path) -> dict[str, Any]:
    from nereus.log.reader import read_run_log

    r = read_run_log(log)
    ev = r.tables["events"]
    events = [(int(s), str(k), d) for s, k, d in zip(ev["step"], ev["kind"], ev["detail"],
                                                     strict=True)]
    devices = next((d for _, k, d in events if k == "devices"), {})
    mem = r.tables.get("gpu_memory", {})
    tr = r.tables.get("transitions", {})
    reps = r.tables.get("replans", {})
    return {
        "closed": bool(r.closed), "steps": [int(s) for s in r.steps["step"]],
        "rewards": [round(float(x), 4) for x in r.steps["reward"]],
        "device": devices.get("rank0", {}), "default_backend": devices.get("default_backend"),
        "dtype": devices.get("dtype"), "pack": devices.get("pack"),
        "generation": devices.get("generation"),
        "peak_bytes_max": int(max(mem["peak_bytes"])) if len(mem.get("peak_bytes", [])) else 0,
        "ooms": [d for _, k, d in events if k == "oom"],
        "redone": [d for _, k, d in events if k == "step-redone"],
        "urgent_memory_replans": sum(1 for c in reps.get("candidates", [])
                                     if "memory" in c["triggers"] and c["urgent"]),
        "transitions": [{"step": int(s), "transports": d.get("transports"),
                         "kinds": sorted({p["kind"] for p in prims})}
                        for s, d, prims in zip(tr.get("step", []), tr.get("dag", []),
                                               tr.get("primitives", []), strict=True)],
    }


def part_b(out: Path, dry_run: bool, ulfm: bool) -> dict[str, Any]:
    device = "cpu" if dry_run else "cuda"
    one = _config(out, "one.yaml", f"  device: {device}\n  inject_oom: {{rank: 0, at_step: 1}}\n")
    _drop_key(one, "device: auto")
    res: dict[str, Any] = {}
    r1 = _launch(one, 1, 4, out / "one.h5", out / "one.json", ulfm, 200)
    got = _read(out / "one.h5") if (out / "one.h5").exists() else {}
    oom = got.get("ooms", [])
    res["one_rank"] = {
        "exit": r1.returncode, **got,
        "ok": r1.returncode == 0 and got.get("steps") == [0, 1, 2, 3]
        and got.get("device", {}).get("kind") == device
        and len(oom) == 1 and oom[0].get("source") == "allocator"
        and len(got.get("redone", [])) == 1 and got.get("urgent_memory_replans", 0) >= 1
        and got.get("peak_bytes_max", 0) > 0}
    four = _config(out, "four.yaml", f"  device: {device}\n" + FORCED)
    _drop_key(four, "device: auto")
    r4 = _launch(four, 4, 4, out / "four.h5", out / "four.json", ulfm, 300)
    got4 = _read(out / "four.h5") if (out / "four.h5").exists() else {}
    kinds = {k for t in got4.get("transitions", []) for k in t["kinds"]}
    labels = {k for t in got4.get("transitions", []) for k in (t["transports"] or {})}
    want_label = "host:gloo" if dry_run else "host:gloo-staged"
    res["four_ranks_shared"] = {
        "exit": r4.returncode, **got4, "primitive_kinds": sorted(kinds),
        "ok": r4.returncode == 0 and got4.get("steps") == [0, 1, 2, 3]
        and {"split", "merge"} <= kinds and labels == {want_label}
        and got4.get("default_backend") == "gloo"}
    for name in ("one.h5", "four.h5", "one.json", "four.json", "one.yaml", "four.yaml"):
        with contextlib.suppress(OSError):
            (out / name).unlink()
    res["ok"] = res["one_rank"]["ok"] and res["four_ranks_shared"]["ok"]
    return res


def _drop_key(path: Path, line: str) -> None:
    """Remove the example's own line (the variant sets the key itself)."""
    text = path.read_text().splitlines(keepends=True)
    path.write_text("".join(t for t in text if line not in t))


# ---------------------------------------------------------------- (c) CUDA against CPU

def part_c(dry_run: bool) -> dict[str, Any]:
    """Separate process: one rank, its own default group."""
    res = run([sys.executable, str(Path(__file__)), "--part-c-worker"]
              + (["--dry-run"] if dry_run else []), 240)
    line = next((ln for ln in res.stdout.splitlines()[::-1] if ln.startswith("{")), "")
    return json.loads(line) if line else {"ok": False, "why": f"exit {res.returncode}"}


def part_c_worker(dry_run: bool) -> dict[str, Any]:
    import numpy as np
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "tests"))
    from support.unit_training import train_step  # the tests' training probe, same step

    from nereus.cluster.devices import DeviceChoice, cpu_choice
    from nereus.cluster.transport import RankPlacement
    from nereus.emu.shards import tensor_specs
    from nereus.emu.unit import Emu, Layout
    from nereus.engines.megatron_model import StageGroups, prepare_device
    from nereus.runtime.execution.device import RankDevice
    from nereus.runtime.worker.state import load_global, new_unit_state
    from nereus.spec.model import MODEL_PRESETS

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    store = dist.HashStore()  # one process: nothing listens
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    solo = dist.new_group([0], backend="gloo")
    groups = StageGroups(solo, solo, solo, solo, solo)
    spec = MODEL_PRESETS["tiny-gpt"]
    emu = Emu("actor-train", "actor-train", Layout(1, 1), (0,))
    rng = np.random.default_rng(5)
    glob = {f: {t.name: (rng.standard_normal(t.global_shape) * (0.05 if f == "param" else 0))
                .astype(np.float32) for t in tensor_specs(spec)}
            for f in ("param", "exp_avg", "exp_avg_sq")}
    tokens = torch.from_numpy(rng.integers(0, spec.vocab_size, (8, 65)))
    gpu = not dry_run and torch.cuda.is_available()
    placements = (RankPlacement(0, "local", "cuda" if gpu else "cpu",
                                "nvidia" if gpu else "cpu", "nvidia:0" if gpu else ""),)
    choice = DeviceChoice("cuda", "nvidia", 0, "nvidia:0", False, "device check") if gpu \
        else cpu_choice("device check dry run")
    if gpu:
        torch.cuda.set_device(0)
        prepare_device(0)

    def one_step(dev: RankDevice | None) -> dict[str, Any]:
        st = new_unit_state(spec, emu, 0, groups, lr=1e-3, device=dev, initialize=False)
        load_global(st, glob)
        grads: dict[str, np.ndarray] = {}
        def keep(p: Any, k: str) -> None:
            if p.grad is not None:  # under mixed precision the masters took it already
                grads[k] = p.grad.detach().float().cpu().numpy().copy()

        handles = [p.register_post_accumulate_grad_hook(lambda p, k=k: keep(p, k))
                   for k, p in st.model.named_parameters()]
        loss = train_step(st, tokens[:, :-1], tokens[:, 1:], micro_batch=4)
        for h in handles:
            h.remove()
        return {"loss": loss, "grads": grads, "param": st.snapshot()["param"], "state": st}

    cpu = one_step(None)
    dev32 = RankDevice(choice, placements, 0, dtype=torch.float32)
    other = one_step(dev32)
    res: dict[str, Any] = {"device": str(dev32.device), "tf32": False,
                           "tolerance": {"loss_rtol": LOSS_RTOL, "grad_rtol": GRAD_RTOL,
                                         "grad_atol": GRAD_ATOL}}
    res["loss_cpu"], res["loss_device"] = cpu["loss"], other["loss"]
    res["loss_rel_diff"] = abs(cpu["loss"] - other["loss"]) / max(abs(cpu["loss"]), 1e-12)
    worst = 0.0
    grads_ok = set(cpu["grads"]) == set(other["grads"])
    for k, g in cpu["grads"].items():
        d = float(np.max(np.abs(g - other["grads"][k])))
        bound = GRAD_RTOL * float(np.max(np.abs(g))) + GRAD_ATOL
        worst = max(worst, d / bound)
        grads_ok &= d <= bound
    res["grad_worst_share_of_tolerance"] = round(worst, 4)
    # after one Adam step an element moves by lr·m/(sqrt(v)+eps) ≈ ±lr: equal where |g| is
    # well above the rounding of the two sides, up to 2·lr where a gradient is ~0 on both
    moved = max(float(np.max(np.abs(cpu["param"][k] - other["param"][k])))
                for k in cpu["param"])
    res["param_max_abs_diff_after_adam"] = moved
    res["ok"] = res["loss_rel_diff"] <= LOSS_RTOL and grads_ok and moved <= 2e-3 + 1e-6
    if gpu:  # the run's precision: bf16 parameters, fp32 masters (reported, not gated)
        bf = one_step(RankDevice(choice, placements, 0, dtype=torch.bfloat16))
        res["loss_bf16_device"] = bf["loss"]
        res["loss_bf16_rel_diff"] = abs(cpu["loss"] - bf["loss"]) / max(abs(cpu["loss"]), 1e-12)
        res["memory_returned"] = _destroy_returns_memory(spec, groups, choice, placements,
                                                         store, emu)
        res["ok"] = res["ok"] and res["memory_returned"]["ok"]
    else:
        res["memory_returned"] = {"ok": True, "skipped": "no device"}
    return res


def _destroy_returns_memory(spec: Any, groups: Any, choice: Any, placements: Any, store: Any,
                            emu: Any) -> dict[str, Any]:
    """A Destroy through the executor gives the unit's memory back to the device."""
    import torch

    from nereus.emu.primitives import Destroy
    from nereus.emu.unit import Emu, Layout
    from nereus.runtime.execution.device import RankDevice
    from nereus.runtime.execution.torch_executor import TorchExecutor
    from nereus.runtime.worker.state import new_unit_state

    dev = RankDevice(choice, placements, 0)
    ex = TorchExecutor(spec, 0, store, "check", device=dev)
    unit = Emu(emu.model_stage, emu.state, Layout(1, 1), (0,))
    twin = Emu(emu.model_stage, emu.state, Layout(1, 1), (1,))  # the replica that stays
    torch.cuda.synchronize()
    base_reserved = torch.cuda.memory_reserved()
    ex.units[unit] = new_unit_state(spec, unit, 0, groups, device=dev, initialize=False)
    held = torch.cuda.memory_allocated()
    reserved = torch.cuda.memory_reserved()
    ex.destroy(Destroy(unit, 0), live={unit, twin})
    after_alloc, after_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    return {"allocated_before": held, "allocated_after": after_alloc,
            "reserved_before": reserved, "reserved_after": after_reserved,
            "ok": after_alloc < held and after_reserved <= max(base_reserved, reserved) and
            after_reserved < reserved}


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "out" / "device_check"))
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--parts", default="a,b,c")
    ap.add_argument("--part-c-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.part_c_worker:
        print(json.dumps(part_c_worker(args.dry_run), default=float))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    summary: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "dry_run": args.dry_run}
    pre = prerequisites(args.dry_run)
    summary["prerequisites"] = pre
    summary["device"] = pre["torch"]["device"] or "cpu"
    if pre["missing"]:
        say("missing: " + ", ".join(pre["missing"]) + "; " + pre["carry"])
    parts = [p for p in args.parts.split(",") if p]
    for part in parts:
        start = time.time()
        try:
            if pre["missing"]:
                raise RuntimeError("prerequisites missing: " + ", ".join(pre["missing"]))
            if part == "a":
                summary["a"] = part_a(out, args.dry_run)
            elif part == "b":
                summary["b"] = part_b(out, args.dry_run, pre["mpiexec"]["ulfm"])
            elif part == "c":
                summary["c"] = part_c(args.dry_run)
        except Exception as e:  # one part failing still leaves the others' figures
            summary[part] = {"ok": False, "why": f"{type(e).__name__}: {e}"}
        summary[part]["seconds"] = round(time.time() - start, 1)
        say(f"part {part}: {'ok' if summary[part].get('ok') else 'FAILED'} "
            f"({summary[part]['seconds']} s)")
    summary["seconds"] = round(time.time() - t0, 1)
    summary["passed"] = all(summary[p].get("ok") for p in parts)
    (out / "device_check.json").write_text(json.dumps(summary, indent=1, default=str))
    (out / "device_check.log").write_text("\n".join(LOG)[-2_000_000:])
    say(f"{'PASS' if summary['passed'] else 'FAIL'}: {out / 'device_check.json'}")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
