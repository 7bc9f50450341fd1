"""The device check of the GPU data plane, driven by benchmarks/device_check.sh.

    python3 benchmarks/device_check.py --out DIR [--dry-run] [--parts a,c,b] [--cap-s S]
                                       [--induce-hang] [--scale X]

Parts, in this order (the cheapest evidence first, so a short window still brings some back):
(a) pack kernels: nereus._kernels built for the device, every byte of random slices checked
    against torch with poisoned outputs (tests/gpu/test_kernels_gpu.py), bandwidth against a
    device copy of the same bytes (benchmarks/pack.py; goal >= 0.90 on the layer and embedding
    plans). Dry run: pack.cu compiled by nvcc for sm_90 where a toolkit is present, the kernels'
    device code in host mode on random slices, the bandwidth script on the CPU.
(c) one training step on the device against transformers on the CPU, fp32, TF32 off
    (benchmarks/device_check_step.py: its gates and tolerances), bf16 reported, a Destroyed
    unit's memory given back. Dry run: the same comparison with the unit on the CPU.
(b) nereus run of examples/grpo-tiny-gpu.yaml: 1 rank on the GPU (generation, training, weight
    sync, the allocator's peaks, an induced out-of-memory error turned into an urgent replan with
    the step redone), then 4 ranks sharing the GPU over the host transport with forced Split /
    Merge transitions on CUDA tensors. Dry run: CPU ranks.

Each part checks its own prerequisites and runs when they hold. Every child runs in its own
session with a time-out from ``BUDGET_S`` (their sum stays under ``--cap-s``, the shell's outer
cap), and is killed as a group — with every process that carries this run's marker in its
environment (mpiexec's ranks, started in sessions of their own) — when it runs out; SIGTERM (the
outer cap) does the same and still writes the summary. DIR/device_check.json is rewritten and
DIR/device_check.log appended after every part. ``--induce-hang`` stops a rank of part (b)'s
first run (SIGSTOP): the check must then kill it and keep the other parts' figures (tested).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARK = "NEREUS_DEVICE_CHECK_RUN"  # this run's token, inherited by every child process
# Seconds for each bounded step on the GPU machine (16 cores); the dry run multiplies them by
# --scale on a slower machine. Their sum stays under the cap the shell gives (tested).
BUDGET_S = {"probe_torch": 10, "probe_mpi4py": 10, "a.build": 85, "a.correct": 25,
            "a.bandwidth": 40, "c": 45, "b.one": 45, "b.four": 65}
PART_ORDER = ("a", "c", "b")
# --induce-hang: part (b)'s first run is known to hang: it is waited for this long once its rank
# is stopped (not scaled: a stopped process does nothing a slower machine would do slower),
# and until then for as long as that run may take (b.one's budget, scaled)
HANG_LIMIT_S = 20


class Check:
    """The summary, the log and the one child running, for one run of the check."""

    def __init__(self, out: Path, dry_run: bool, cap_s: float, scale: float) -> None:
        self.out, self.dry_run, self.scale = out, dry_run, scale
        self.deadline = time.monotonic() + cap_s
        self.token = uuid.uuid4().hex
        os.environ[MARK] = self.token
        self.summary: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dry_run": dry_run,
            "cap_s": cap_s, "scale": scale, "budget_s": BUDGET_S, "marker": self.token,
            "order": []}
        self.child: subprocess.Popen[str] | None = None
        self.hung_at: float | None = None  # when --induce-hang stopped the running child's rank
        self.log = open(out / "device_check.log", "a", encoding="utf-8")  # noqa: SIM115

    def say(self, text: str) -> None:
        self.log.write(text + "\n")
        self.log.flush()
        print(text, flush=True)

    def save(self) -> None:
        """The summary as it stands (written whole, then renamed: never half a file)."""
        tmp = self.out / ".device_check.json.tmp"
        tmp.write_text(json.dumps(self.summary, indent=1, default=str))
        tmp.replace(self.out / "device_check.json")

    def budget(self, step: str) -> float:
        limit = BUDGET_S["b.one" if step == "b.hang" else step]
        return max(1.0, min(limit * self.scale, self.deadline - time.monotonic() - 2))

    def hung(self) -> None:
        """The running child's rank was stopped (``--induce-hang``): wait ``HANG_LIMIT_S`` more
        at most."""
        self.hung_at = time.monotonic()

    def run(self, cmd: list[str], step: str, env: dict[str, str] | None = None,
            on_start: Any = None) -> dict[str, Any]:
        """Run ``cmd`` in its own session within the step's budget; on time-out kill it and all
        it started. Returns exit code, output tails, seconds, whether it timed out."""
        limit = self.budget(step)
        self.say(f"$ {' '.join(cmd)}   (limit {limit:.0f} s"
                 + (f"; {HANG_LIMIT_S} s once its rank is stopped)" if step == "b.hang" else ")"))
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=ROOT, env={**os.environ, **(env or {})},
                                start_new_session=True)
        self.child, self.hung_at = proc, None
        if on_start is not None:
            on_start(proc)
        timed_out = False
        try:
            while True:  # in slices of at most 1 s: a stopped rank shortens the wait
                end = t0 + limit
                if self.hung_at is not None:
                    end = min(end, self.hung_at + HANG_LIMIT_S)
                try:
                    out, err = proc.communicate(timeout=max(0.0, min(1.0, end - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= end:
                        raise
        except subprocess.TimeoutExpired:
            timed_out = True
            waited = time.monotonic() - t0
            left = self.kill(proc)
            out, err = proc.communicate()
            self.say(f"  timed out after {waited:.0f} s: killed its process group"
                     + (f"; still alive: {left}" if left else " and every process it started"))
        finally:
            self.child = None
        tail = ((out or "")[-2000:] + (err or "")[-4000:]).strip()
        if tail:
            self.log.write(tail + "\n")
        return {"code": proc.returncode, "stdout": out or "", "stderr": err or "",
                "seconds": round(time.monotonic() - t0, 1), "timed_out": timed_out}

    def marked(self) -> list[int]:
        """Processes other than this one carrying this run's marker (its descendants, also
        those reparented after their parent died)."""
        want = f"{MARK}={self.token}".encode()
        found = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if want in (d / "environ").read_bytes().split(b"\0"):
                    found.append(int(d.name))
        return found

    def kill(self, proc: subprocess.Popen[str] | None) -> list[int]:
        """TERM (and CONT, for a stopped one) to the child's group and every marked process,
        KILL what is left after 3 s (again for up to 5 s, a process forked meanwhile too);
        returns the pids still alive after that."""
        groups = {proc.pid} if proc is not None else set()
        for sig in (signal.SIGTERM, signal.SIGCONT):
            for pid in self.marked():
                with contextlib.suppress(OSError):
                    groups.add(os.getpgid(pid))
                    os.kill(pid, sig)
            groups.discard(os.getpgrp())  # never this process's own group
            for pg in groups:
                with contextlib.suppress(OSError):
                    os.killpg(pg, sig)
        end = time.monotonic() + 3
        while time.monotonic() < end and (any(_alive(p) for p in self.marked())
                                          or (proc and proc.poll() is None)):
            time.sleep(0.1)
        for pg in groups:
            with contextlib.suppress(OSError):
                os.killpg(pg, signal.SIGKILL)
        end = time.monotonic() + 5  # KILL again whatever is still there (or was forked since)
        while (left := [p for p in self.marked() if _alive(p)]) and time.monotonic() < end:
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        return left


def _alive(pid: int) -> bool:
    """Not gone and not a zombie (a zombie waits only for its parent to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


# ---------------------------------------------------------------- prerequisites, per part

def _have(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def prerequisites(chk: Check) -> dict[str, Any]:
    """What each part needs, found or not (``missing`` per part)."""
    t = chk.run([sys.executable, str(Path(__file__)), "--torch-facts"], "probe_torch")
    line = next((ln for ln in t["stdout"].splitlines()[::-1] if ln.startswith("{")), "{}")
    facts = json.loads(line)
    gpu = bool(facts.get("available"))
    cuda_home = os.environ.get("CUDA_HOME", "")
    headers = bool(cuda_home) and (Path(cuda_home) / "include" / "cuda_runtime.h").exists()
    nvcc = str(Path(cuda_home) / "bin" / "nvcc") if cuda_home and \
        (Path(cuda_home) / "bin" / "nvcc").exists() else None
    mpiexec = shutil.which("mpiexec")
    version = ""
    if mpiexec:
        with contextlib.suppress(Exception):
            version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                                     timeout=10).stdout.splitlines()[0]
    mpi = chk.run([sys.executable, "-c", "from mpi4py import MPI; "
                   "print(MPI.Get_library_version().splitlines()[0])"], "probe_mpi4py")
    found: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": facts,
        "modules": {m: _have(m) for m in ("megatron.core", "transformers", "tokenizers", "h5py",
                                          "yaml", "numpy", "packaging", "pynvml")},
        "mpi4py_loads": mpi["code"] == 0, "mpi_library": mpi["stdout"].strip()[:120],
        "mpiexec": {"path": mpiexec, "version": version, "ulfm": _ulfm(version),
                    "open_mpi": "Open MPI" in version},
        "cuda_home": cuda_home or None, "cuda_headers": headers, "nvcc": nvcc,
        "cxx": shutil.which("c++") or shutil.which("g++")}
    mods = found["modules"]
    need: dict[str, list[tuple[str, bool]]] = {
        "a": [("a C++ compiler", bool(found["cxx"]))],
        "c": [("megatron.core", mods["megatron.core"]),
              ("transformers (the reference)", mods["transformers"])],
        "b": [("megatron.core", mods["megatron.core"]), ("h5py", mods["h5py"]),
              ("yaml", mods["yaml"]), ("from mpi4py import MPI", found["mpi4py_loads"]),
              ("mpiexec", bool(mpiexec)),
              # nereus run reads the task's tokenizer (nereus/rl/data) through transformers
              ("transformers and tokenizers (the run's tokenizer)",
               mods["transformers"] and mods["tokenizers"])]}
    if not chk.dry_run:
        for part in need:
            need[part].append(("a CUDA device", gpu))
        need["a"] += [("nvcc in CUDA_HOME", bool(nvcc)), ("CUDA headers in CUDA_HOME", headers)]
    found["missing"] = {p: [what for what, ok in n if not ok] for p, n in need.items()}
    return found


def _ulfm(version: str) -> bool:
    m = re.search(r"Open MPI\)? (\d+)\.", version) or re.search(r"(\d+)\.\d+\.\d+", version)
    return "Open MPI" in version and m is not None and int(m.group(1)) >= 5


# ---------------------------------------------------------------- (a) pack kernels

def part_a(chk: Check, pre: dict[str, Any]) -> dict[str, Any]:
    if chk.dry_run:
        return _part_a_dry(chk, pre)
    major, minor = pre["torch"]["capability"]
    env = {"NEREUS_BUILD_KERNELS": "1", "MAX_JOBS": str(os.cpu_count() or 8),
           "TORCH_CUDA_ARCH_LIST": os.environ.get("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")}
    b = chk.run([sys.executable, "setup.py", "build_ext", "--inplace"], "a.build", env)
    res: dict[str, Any] = {"arch": env["TORCH_CUDA_ARCH_LIST"], "build_s": b["seconds"],
                           "built": b["code"] == 0}
    if b["code"] != 0:
        return {**res, "ok": False, "why": "build failed" + (" (timed out)" if b["timed_out"]
                                                             else "")}
    t = chk.run([sys.executable, "tests/gpu/test_kernels_gpu.py"], "a.correct")
    res["correct"] = t["code"] == 0 and "SKIP" not in t["stdout"] + t["stderr"]
    p = chk.run([sys.executable, "benchmarks/pack.py", "--json", "--tile-bytes", "32768,65536"],
                "a.bandwidth")
    rows = json.loads(p["stdout"]) if p["code"] == 0 else []
    res["bandwidth"] = _best_of(rows)
    goal = [v for k, v in res["bandwidth"].items() if not k.startswith("norms")]
    res["goal_0.90_met"] = bool(goal) and all(v["kernel_vs_copy"] >= 0.90 for v in goal)
    res["ok"] = res["correct"] and res["goal_0.90_met"]
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


def _part_a_dry(chk: Check, pre: dict[str, Any]) -> dict[str, Any]:
    """The toolkit line (nvcc for sm_90, where present), the kernels' device code in host mode
    on random slices with outputs poisoned, the bandwidth script on the CPU."""
    res: dict[str, Any] = {"mode": "host (CPU)"}
    if pre["nvcc"] and pre["cuda_headers"]:
        with tempfile.TemporaryDirectory() as tmp:
            b = chk.run([pre["nvcc"], "-arch=sm_90", "-O3", "-Xcompiler", "-fPIC", "-I",
                         "kernels", "-c", "kernels/cuda/pack.cu", "-o", f"{tmp}/pack.o"],
                        "a.build")
        res["nvcc_sm90"] = b["code"] == 0
    else:
        res["nvcc_sm90"] = "skipped: no CUDA toolkit with headers"
    t = chk.run([sys.executable, str(Path(__file__)), "--host-kernels"], "a.correct")
    line = next((ln for ln in t["stdout"].splitlines()[::-1] if ln.startswith("{")), "{}")
    res.update(json.loads(line))
    p = chk.run([sys.executable, "benchmarks/pack.py", "--json", "--device", "cpu", "--reps",
                 "1", "--plans", "norms-65"], "a.bandwidth")
    res["bandwidth_rows"] = len(json.loads(p["stdout"])) if p["code"] == 0 else 0
    res["ok"] = (res.get("correct") is True and res["nvcc_sm90"] is not False
                 and res["bandwidth_rows"] > 0)
    return res


def torch_facts() -> dict[str, Any]:
    """torch's build and device, asked in a child: the check itself never holds a CUDA
    context (its memory would be missing from the parts' measurements)."""
    import torch

    gpu = torch.cuda.is_available()
    return {"version": torch.__version__, "cuda": torch.version.cuda,
            "hip": getattr(torch.version, "hip", None), "available": gpu,
            "device": torch.cuda.get_device_name(0) if gpu else None,
            "capability": list(torch.cuda.get_device_capability(0)) if gpu else None}


def host_kernels() -> dict[str, Any]:
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
    return {"cases": cases, "correct": True}


# ---------------------------------------------------------------- (c) one step

def part_c(chk: Check) -> dict[str, Any]:
    r = chk.run([sys.executable, "benchmarks/device_check_step.py"]
                + (["--dry-run"] if chk.dry_run else []), "c")
    line = next((ln for ln in r["stdout"].splitlines()[::-1] if ln.startswith("{")), "")
    if not line:
        return {"ok": False, "why": f"exit {r['code']}" + (" (timed out)" if r["timed_out"]
                                                          else "")}
    return dict(json.loads(line))


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "out" / "device_check"))
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--parts", default=",".join(PART_ORDER))
    ap.add_argument("--cap-s", type=float, default=330.0)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--induce-hang", action="store_true")
    ap.add_argument("--host-kernels", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--torch-facts", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.host_kernels or args.torch_facts:
        print(json.dumps(host_kernels() if args.host_kernels else torch_facts()))
        return 0
    if sum(BUDGET_S.values()) * args.scale >= args.cap_s:
        print(f"device check: budgets {sum(BUDGET_S.values())} s x {args.scale} do not fit "
              f"--cap-s {args.cap_s:g}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chk = Check(out, args.dry_run, args.cap_s, args.scale)

    def outer_cap(signum: int, _frame: Any) -> None:
        chk.summary["stopped"] = f"signal {signum} (the outer cap)"
        chk.summary["passed"] = False
        chk.save()  # first: the shell's KILL follows 10 s after its TERM
        chk.summary["left_behind"] = chk.kill(chk.child)
        chk.save()
        chk.say("device check: stopped by the outer cap; the summary has what finished")
        os._exit(124)

    signal.signal(signal.SIGTERM, outer_cap)
    t0 = time.monotonic()
    pre = prerequisites(chk)
    chk.summary["prerequisites"] = pre
    chk.summary["device"] = pre["torch"].get("device") or "cpu"
    chk.save()
    parts = [p for p in PART_ORDER if p in args.parts.split(",")]
    for part in parts:
        start = time.monotonic()
        missing = pre["missing"][part]
        try:
            if missing:
                got: dict[str, Any] = {"ok": False, "skipped": "missing: " + ", ".join(missing)}
            elif part == "a":
                got = part_a(chk, pre)
            elif part == "c":
                got = part_c(chk)
            else:
                from device_check_run import part_b  # beside this file

                got = part_b(chk, pre, args.induce_hang)
        except Exception as e:  # one part failing still leaves the others' figures
            got = {"ok": False, "why": f"{type(e).__name__}: {e}"}
        got["seconds"] = round(time.monotonic() - start, 1)
        chk.summary[part] = got
        chk.summary["order"].append(part)
        chk.say(f"part {part}: {'ok' if got.get('ok') else 'FAILED'} ({got['seconds']} s)"
                + (f" — {got.get('skipped') or got.get('why')}" if not got.get("ok") else ""))
        chk.save()
    left = chk.marked()
    chk.summary["left_behind"] = [p for p in left if _alive(p)]
    chk.summary["seconds"] = round(time.monotonic() - t0, 1)
    chk.summary["passed"] = all(chk.summary[p].get("ok") for p in parts) and \
        not chk.summary["left_behind"]
    chk.save()
    chk.say(f"{'PASS' if chk.summary['passed'] else 'FAIL'}: {out / 'device_check.json'}")
    return 0 if chk.summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
