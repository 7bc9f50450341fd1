"""Adaptation policies in the trace-driven simulator (DESIGN.md §2.1, §7; issue 5).

(a) Llama-3.1-8B PPO (5 model-stages, rule-based reward, global batch 256 prompts of 1,024
    tokens) on a 32-GPU H200 allocation (4 nodes × 8) whose pool follows each shared 16-node AWS
    spot trace at 2 GPUs per trace node, with the paper's length growth 1,147.5 → 3,722 tokens
    (p95 1,339 → 4,072) over 25 steps: mean step latency (transitions included) of every policy,
    and nereus' gain over static and dynarl.
(b) A γ sweep (0 … 1) of the nereus policy on the same runs.
(c) A 1,000-step run whose pool grows 32 → 1,024 GPUs (doubling every 2 simulated hours; a
    synthetic growth trace, since no public trace reaches 1,024 GPUs) with length growth
    500 → 8,000 tokens: transitions and their share of run time (paper: 6 transitions, 0.079%).

True step times come from the cost model with hidden efficiencies (the H200 measured defaults
perturbed by ±20% per op class) and 2% noise; the controller starts from the measured defaults
and calibrates online. Every figure is a ratio against a baseline policy of the same run.

    python benchmarks/policies.py [--json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from nereus.cost.calibration import default_calibration
from nereus.sim.engine import POLICIES, SimConfig, SimResult, simulate
from nereus.sim.traces import GpuTrace, load_spot_trace, paper_length_trace
from nereus.sim.truth import HiddenTruth, hidden_calibration
from nereus.spec.hardware import H200, ClusterSpec
from nereus.spec.job import JobSpec, Setup
from nereus.spec.model import LLAMA_3_1_8B

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces" / "spot-traces" / "availability-16node"
GAMMAS = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0)
DOUBLING_S = 7200.0  # the 1,000-step run's pool doubles every 2 simulated hours, up to 1,024


def ppo_setup(nodes: int, global_batch: int, gen_len: float, p95: float) -> Setup:
    models = (("actor", LLAMA_3_1_8B), ("critic", LLAMA_3_1_8B), ("reference", LLAMA_3_1_8B))
    job = JobSpec(
        algorithm="ppo", mode="sync", models=models, global_batch=global_batch,
        prompt_len=1024, gen_len=round(gen_len), gen_len_p95=round(p95), reward_model=False,
    )
    return Setup(job, ClusterSpec(nodes, 8, H200))


def run(setup: Setup, trace: GpuTrace, lengths: Any, steps: int, policy: str, gamma: float = 0.5) -> SimResult:
    truth = HiddenTruth(hidden_calibration(default_calibration(), H200, seed=1), 0.02, seed=1)
    cfg = SimConfig(steps=steps, policy=policy, gamma=gamma, every_k=3)
    return simulate(setup, trace, lengths, cfg, truth, default_calibration())


def growth_trace(start_gpus: int, end_gpus: int, doubling_s: float) -> GpuTrace:
    times, gpus = [0.0], [start_gpus]
    while gpus[-1] < end_gpus:
        times.append(times[-1] + doubling_s)
        gpus.append(min(end_gpus, gpus[-1] * 2))
    return GpuTrace(tuple(times), tuple(gpus))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="skip the 1,000-step run")
    ap.add_argument("--long-only", action="store_true", help="only the 1,000-step run (c)")
    args = ap.parse_args()
    lengths = paper_length_trace("25-step")
    first = lengths.at(0)
    setup = ppo_setup(4, 256, first.mean, first.p95)
    rows: list[dict[str, Any]] = []
    sweep: list[dict[str, Any]] = []
    for path in [] if args.long_only else sorted(TRACES.glob("*.json")):
        trace = load_spot_trace(path, gpus_per_node=2, max_gpus=32)
        res = {p: run(setup, trace, lengths, 25, p) for p in POLICIES}
        for _p, r in res.items():
            rows.append({
                "trace": path.stem, **r.summary(),
                "vs_static_pct": 100 * (1 - r.mean_step_s / res["static"].mean_step_s),
                "vs_dynarl_pct": 100 * (1 - r.mean_step_s / res["dynarl"].mean_step_s),
            })
        for g in GAMMAS:
            r = run(setup, trace, lengths, 25, "nereus", gamma=g)
            sweep.append({"trace": path.stem, "gamma": g, "mean_step_s": r.mean_step_s,
                          "transitions": r.transitions,
                          "vs_static_pct": 100 * (1 - r.mean_step_s / res["static"].mean_step_s)})
    long_run: dict[str, Any] = {}
    if not args.quick:
        big = paper_length_trace("1000-step")
        s0 = big.at(0)
        setup_big = ppo_setup(128, 1024, s0.mean, s0.p95)
        t0 = time.perf_counter()
        r = run(setup_big, growth_trace(32, 1024, DOUBLING_S), big, 1000, "nereus")
        long_run = {
            "steps": r.steps, "transitions": r.transitions, "transition_s": r.transition_s,
            "total_s": r.total_s, "transition_share_pct": 100 * r.transition_s / r.total_s,
            "max_gpus": max(rec.pool_gpus for rec in r.records),
            "wall_s": time.perf_counter() - t0,
        }
    out = {"policies": rows, "gamma_sweep": sweep, "long_run": long_run}
    if args.json:
        print(json.dumps(out))
        return 0
    if rows:
        print("(a) mean step latency, transitions included (25 steps, 32-GPU allocation)")
        print(f"{'trace':24s} {'policy':8s} {'mean s':>8s} {'trans':>5s} {'trans s':>8s} "
              f"{'vs static':>9s} {'vs dynarl':>9s}")
        for row in rows:
            print(f"{row['trace']:24s} {row['policy']:8s} {row['mean_step_s']:8.1f} "
                  f"{row['transitions']:5d} {row['transition_s']:8.1f} "
                  f"{row['vs_static_pct']:8.1f}% {row['vs_dynarl_pct']:8.1f}%")
        print("\n(b) gamma sweep (nereus)")
        for row in sweep:
            print(f"{row['trace']:24s} gamma={row['gamma']:4.2f} mean {row['mean_step_s']:8.1f} s "
                  f"transitions {row['transitions']:2d} vs static {row['vs_static_pct']:6.1f}%")
    if long_run:
        print("\n(c) 1,000 steps, pool 32 → 1,024 GPUs, length 500 → 8,000")
        print(f"transitions {long_run['transitions']}, {long_run['transition_s']:.1f} s of "
              f"{long_run['total_s']:.0f} s = {long_run['transition_share_pct']:.3f}% (paper: 6, 0.079%); "
              f"pool reached {long_run['max_gpus']} GPUs ({long_run['total_s'] / 3600:.2f} simulated h; "
              f"one doubling per {DOUBLING_S / 3600:.0f} h)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
