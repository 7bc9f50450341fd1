"""Part (b) of the device check (benchmarks/device_check.py): ``nereus run`` of
examples/grpo-tiny-gpu.yaml on the device — 1 rank with an induced out-of-memory error (urgent
replan, step redone), then 4 ranks sharing the GPU over the host transport with forced Split /
Merge transitions — each run a child of the check (its time-out, its process-group kill), read
back from its HDF5 log. ``--induce-hang`` stops the first run's rank (SIGSTOP)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "grpo-tiny-gpu.yaml"


FORCED = """  force_transitions:
    - {at_step: 0, layouts: {actor-train: [2, 1]}}
    - {at_step: 1, layouts: {actor-train: [1, 2]}}
    - {at_step: 2, layouts: {actor-train: [1, 1]}}
"""
RANK_TIMEOUT_S = 20  # runtime.timeout_s of the generated configs: a stuck collective fails soon


def _config(out: Path, name: str, lines: str) -> Path:
    text = EXAMPLE.read_text()
    keep = "".join(t for t in text.splitlines(keepends=True) if "device: auto" not in t)
    p = out / name
    p.write_text(keep.replace("\nruntime:\n", f"\nruntime:\n  timeout_s: {RANK_TIMEOUT_S}\n"
                              + lines))
    return p


def _launch(chk: Any, pre: dict[str, Any], cfg: Path, ranks: int, step: str,
            on_start: Any = None) -> dict[str, Any]:
    """``nereus run`` where mpiexec has ULFM (Open MPI 5); else the same rank program under the
    image's mpiexec (what nereus run starts after its checks), over TCP (as slurm/*.sbatch)."""
    log, summary = cfg.with_suffix(".h5"), cfg.with_suffix(".json")
    if pre["mpiexec"]["ulfm"]:
        cmd = [sys.executable, "-m", "nereus", "run", str(cfg), "--ranks", str(ranks),
               "--steps", "4", "--log", str(log), "--json"]
    else:
        mca = ["--mca", "btl", "tcp,self"] if pre["mpiexec"]["open_mpi"] else []
        cmd = ["mpiexec", "--allow-run-as-root", "--oversubscribe", *mca, "-n", str(ranks),
               sys.executable, "-m", "nereus.runtime.worker.main", "--config", str(cfg),
               "--log", str(log), "--ranks", str(ranks), "--steps", "4",
               "--summary-json", str(summary)]
    r = chk.run(cmd, step, {"OMP_NUM_THREADS": "2"}, on_start)
    got = _read(log) if log.exists() and not r["timed_out"] else {}
    return {"exit": r["code"], "timed_out": r["timed_out"], "seconds": r["seconds"], **got}


def _stop_a_rank(chk: Any) -> Any:
    """``--induce-hang``: SIGSTOP the first rank of the run once it has started (a rank stuck
    in a kernel or a collective looks the same to everyone else)."""
    def watch(proc: subprocess.Popen[str]) -> None:
        def stop() -> None:
            end = time.monotonic() + 60
            while time.monotonic() < end and proc.poll() is None:
                for pid in chk.marked():
                    with contextlib.suppress(OSError):
                        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                        if b"nereus.runtime.worker.main" in cmd:
                            time.sleep(2)  # past its start: inside the job
                            os.kill(pid, signal.SIGSTOP)
                            chk.hung()  # the check waits HANG_LIMIT_S from here
                            chk.say(f"  induced hang: rank process {pid} stopped (SIGSTOP)")
                            return
                time.sleep(0.2)

        threading.Thread(target=stop, daemon=True).start()

    return watch


def part_b(chk: Any, pre: dict[str, Any], induce_hang: bool) -> dict[str, Any]:
    device = "cpu" if chk.dry_run else "cuda"
    res: dict[str, Any] = {}
    one = _config(chk.out, "one.yaml", f"  device: {device}\n"
                  "  inject_oom: {rank: 0, at_step: 1}\n")
    got = _launch(chk, pre, one, 1, "b.hang" if induce_hang else "b.one",
                  _stop_a_rank(chk) if induce_hang else None)
    oom = got.get("ooms", [])
    res["one_rank"] = {**got, "ok": got["exit"] == 0 and got.get("steps") == [0, 1, 2, 3]
                       and got.get("device", {}).get("kind") == device
                       and len(oom) == 1 and oom[0].get("source") == "allocator"
                       and len(got.get("redone", [])) == 1
                       and got.get("urgent_memory_replans", 0) >= 1
                       and got.get("peak_bytes_max", 0) > 0}
    if got["timed_out"]:  # the device may still be held by what would not die: stop here
        res["four_ranks_shared"] = {"ok": False, "skipped": "after the one-rank run hung"}
    else:
        four = _config(chk.out, "four.yaml", f"  device: {device}\n" + FORCED)
        got4 = _launch(chk, pre, four, 4, "b.four")
        kinds = {k for t in got4.get("transitions", []) for k in t["kinds"]}
        labels = {k for t in got4.get("transitions", []) for k in (t["transports"] or {})}
        want = "host:gloo" if chk.dry_run else "host:gloo-staged"
        res["four_ranks_shared"] = {
            **got4, "primitive_kinds": sorted(kinds),
            "ok": got4["exit"] == 0 and got4.get("steps") == [0, 1, 2, 3]
            and {"split", "merge"} <= kinds and labels == {want}
            and got4.get("default_backend") == "gloo"}
    for p in chk.out.iterdir():
        if p.stem in ("one", "four"):
            with contextlib.suppress(OSError):
                p.unlink()
    res["ok"] = res["one_rank"]["ok"] and res["four_ranks_shared"]["ok"]
    if not res["ok"]:
        res["why"] = "; ".join(f"{name}: " + (r.get("skipped") or ("timed out" if r.get(
            "timed_out") else f"exit {r.get('exit')}, checks failed"))
            for name, r in res.items() if isinstance(r, dict) and not r["ok"])
    return res


def _read(log: Path) -> dict[str, Any]:
    from nereus.log.reader import read_run_log

    r = read_run_log(log)
    ev = r.tables["events"]
    events = [(int(s), str(k), d) for s, k, d in zip(ev["step"], ev["kind"], ev["detail"],
                                                     strict=True)]
    devices: dict[str, Any] = next((d for _, k, d in events if k == "devices"), {})
    mem = r.tables.get("gpu_memory", {})
    tr = r.tables.get("transitions", {})
    reps = r.tables.get("replans", {})
    adm = r.tables.get("admissions", {})
    urgent_at = {int(k): str(p) == "urgent"
                 for k, p in zip(adm.get("step", []), adm.get("path", []), strict=True)}
    return {
        "closed": bool(r.closed), "steps": [int(s) for s in r.steps["step"]],
        "rewards": [round(float(x), 4) for x in r.steps["reward"]],
        "device": devices.get("rank0", {}), "default_backend": devices.get("default_backend"),
        "dtype": devices.get("dtype"), "pack": devices.get("pack"),
        "generation": devices.get("generation"),
        "peak_bytes_max": int(max(mem["peak_bytes"])) if len(mem.get("peak_bytes", [])) else 0,
        "ooms": [d for _, k, d in events if k == "oom"],
        "redone": [d for _, k, d in events if k == "step-redone"],
        "urgent_memory_replans": sum(
            1 for k, t in zip(reps.get("step", []), reps.get("trigger", []), strict=True)
            if "memory" in str(t).split(",") and urgent_at.get(int(k), False)),
        "transitions": [{"step": int(s), "transports": d.get("transports"),
                         "kinds": sorted({p["kind"] for p in prims})}
                        for s, d, prims in zip(tr.get("step", []), tr.get("dag", []),
                                               tr.get("primitives", []), strict=True)]}
