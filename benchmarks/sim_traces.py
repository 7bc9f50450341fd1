"""What each GPU trace does inside a simulated run: pool changes the run actually meets.

The job of ``benchmarks/policies.py``: Llama-3.1-8B PPO (5 model-stages, rule-based reward, 256
prompts of 1,024 tokens, generated length 1,147.5 → 3,722 over 25 steps from the paper's points),
H200, 4 nodes of 8 GPUs; the nereus policy; true times from the shape truth; calibration from
measured stage times. Traces (``data/traces``):

- the two 16-node AWS spot availability traces (2 GPUs per trace node, capped at 32) and the
  two 4-node preemption traces (8 GPUs per trace node), ticks of 300 s as recorded;
- the InfiniteHBD fault trace over the job's 4 nodes, rebased so its first event falls one minute
  into the run, at time scales 1 (as recorded), 1e-3 and 1e-4 (the trace compressed 1,000× and
  10,000×: months of faults into hours).

Per trace: simulated wall time of the run, changes of the trace inside that time, pool changes
the run saw between steps, transitions, mean step. ``--steps`` sets the run length (default 25).

    python benchmarks/sim_traces.py [--json] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from nereus.cost.calibration import default_calibration
from nereus.sim.engine import SimConfig, simulate
from nereus.sim.shape_truth import ShapeTruth
from nereus.sim.traces import GpuTrace, load_fault_trace, load_spot_trace, paper_length_trace
from nereus.spec.hardware import H200, ClusterSpec
from nereus.spec.job import JobSpec, Setup
from nereus.spec.model import LLAMA_3_1_8B

ROOT = Path(__file__).resolve().parents[1] / "data" / "traces"
NODES, GPN = 4, 8


def setup() -> Setup:
    m = LLAMA_3_1_8B
    lp = paper_length_trace("25-step").at(0)
    job = JobSpec("ppo", "sync", (("actor", m), ("critic", m), ("reference", m)),
                  global_batch=256, prompt_len=1024, gen_len=round(lp.mean),
                  gen_len_p95=round(lp.p95), reward_model=False)
    return Setup(job, ClusterSpec(NODES, GPN, H200))


def traces() -> list[tuple[str, GpuTrace]]:
    out: list[tuple[str, GpuTrace]] = []
    for p in sorted((ROOT / "spot-traces" / "availability-16node").glob("*.json")):
        out.append((f"spot {p.stem}", load_spot_trace(p, 2, NODES * GPN)))
    for p in sorted((ROOT / "spot-traces" / "preemption-4node").glob("*.json")):
        out.append((f"preemption {p.stem}", load_spot_trace(p, GPN, NODES * GPN)))
    fault = ROOT / "fault-trace" / "fault_trace_first_half.json"
    for scale in (1.0, 1e-3, 1e-4):
        out.append((f"fault x{scale:g}", load_fault_trace(fault, NODES, GPN, time_scale=scale)))
    return out


def changes_within(trace: GpuTrace, end_s: float) -> int:
    return sum(1 for i in range(1, len(trace.gpus))
               if trace.times_s[i] <= end_s and trace.gpus[i] != trace.gpus[i - 1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=25)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    s = setup()
    lengths = paper_length_trace("25-step")
    rows: list[dict[str, Any]] = []
    for name, trace in traces():
        res = simulate(s, trace, lengths, SimConfig(steps=args.steps), ShapeTruth(),
                       default_calibration())
        end = res.records[-1].clock_s + res.records[-1].step_s
        rows.append({
            "trace": name, "run_s": end, "trace_changes_total": trace.changes,
            "trace_changes_in_run": changes_within(trace, end),
            "pool_changes_seen": res.pool_changes, "transitions": res.transitions,
            "mean_step_s": res.mean_step_s, "waited_s": res.wait_s,
            "pools": sorted({r.pool_gpus for r in res.records}),
        })
    if args.json:
        print(json.dumps({"rows": rows, "load_avg_1min": load}))
        return 0
    print(f"{'trace':>32} {'run s':>8} {'wait s':>7} {'changes':>8} {'in run':>7} {'seen':>5} {'trans':>6} "
          f"{'s/step':>7}  pools")
    for r in rows:
        print(f"{r['trace']:>32} {r['run_s']:>8.0f} {r['waited_s']:>7.0f} {r['trace_changes_total']:>8} "
              f"{r['trace_changes_in_run']:>7} {r['pool_changes_seen']:>5} {r['transitions']:>6} "
              f"{r['mean_step_s']:>7.1f}  {r['pools']}")
    print(f"1-minute load average: {load:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
