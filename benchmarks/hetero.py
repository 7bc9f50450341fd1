"""Heterogeneous NVIDIA + AMD pools, simulated at scale (issue 23).

Llama-3.1-8B PPO (5 model-stages, rule-based reward, global batch 512 prompts of 1,024 tokens,
2,048 generated, p95 4,096) on 8 nodes × 8 H200 and 8 nodes × 8 MI300X (128 GPUs):

(a) one pool, all GPUs up: the predicted step of the vendor-aware plan against the best plan on
    each type alone and against vendor-blind plans (a planner that takes every GPU for an H200,
    or for an MI300X), each costed truthfully on the mixed pool (every replica on its own type,
    links between types as they are, the host transport between vendors);
(b) a trace per type: the H200 nodes are spot nodes following the shared AWS spot trace
    (us-east-2b, 16-node availability, 2 trace nodes per H200 node, ticks compressed ×0.1), the
    MI300X nodes are reserved (always up). Every policy runs the same steps
    (:mod:`nereus.sim.mixed`): mean step time (transitions included), transitions, restarts,
    time spent waiting for GPUs, and the makespan.

The cost model is the truth here (default calibrations: H200 measured, MI300X from published
figures, decode and copy classes conservative), so (a) and (b) compare plans and policies, not
the model's accuracy. Every figure is a ratio against the vendor-aware plan of the same run.

    python benchmarks/hetero.py [--json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from nereus.cost.calibration import default_calibration
from nereus.plan.hetero import evaluate_plan, typed_setup
from nereus.plan.search import search_plan
from nereus.sim.mixed import MIXED_POLICIES, MixedResult, simulate_mixed
from nereus.sim.traces import GpuTrace, load_spot_trace
from nereus.spec.hardware import H200, MI300X, ClusterSpec, NodeGroup
from nereus.spec.job import JobSpec, Setup
from nereus.spec.model import LLAMA_3_1_8B

TRACE = (Path(__file__).resolve().parents[1] / "data" / "traces" / "spot-traces"
         / "availability-16node" / "us-east-2b_v100_1.json")


def mixed_setup(nodes_each: int) -> Setup:
    models = (("actor", LLAMA_3_1_8B), ("critic", LLAMA_3_1_8B), ("reference", LLAMA_3_1_8B))
    job = JobSpec(algorithm="ppo", mode="sync", models=models, global_batch=512,
                  prompt_len=1024, gen_len=2048, gen_len_p95=4096, reward_model=False)
    cluster = ClusterSpec.mixed((NodeGroup(nodes_each, H200), NodeGroup(nodes_each, MI300X)), 8)
    return Setup(job, cluster)


def one_pool(setup: Setup) -> dict[str, Any]:
    """(a): predicted step per plan on the whole mixed pool, and the planner's time."""
    cl = setup.cluster
    calib = default_calibration()
    t0 = time.perf_counter()
    aware = search_plan(setup, calib)
    decision_s = time.perf_counter() - t0
    rows: dict[str, Any] = {"vendor-aware": {"step_s": aware.predicted_step_s,
                                             "placement": _placement(setup, aware.plan)}}
    for t in cl.types:
        alone = search_plan(typed_setup(setup, t), calib, cl.gpus_of(t))
        rows[f"{t.name}-only"] = {"step_s": evaluate_plan(setup, alone.plan, calib).step_s,
                                  "placement": _placement(setup, alone.plan)}
    for t in cl.types:
        blind = search_plan(typed_setup(setup, t), calib)
        cost = evaluate_plan(setup, blind.plan, calib)
        rows[f"blind-as-{t.name}"] = {
            "step_s": cost.step_s, "believed_step_s": blind.predicted_step_s,
            "over_capacity_gpus": len(cost.over_capacity),
            "placement": _placement(setup, blind.plan)}
    base = rows["vendor-aware"]["step_s"]
    for r in rows.values():
        r["vs_vendor_aware"] = r["step_s"] / base
    return {"decision_s": decision_s, "plans": rows}


def _placement(setup: Setup, plan: Any) -> dict[str, str]:
    cl = setup.cluster
    return {sp.name: f"({sp.dp},{sp.tp},{sp.pp}) on "
            + "+".join(sorted({cl.type_name(g) for g in sp.gpus})) for sp in plan.stages}


def spot_trace(nodes: int, time_scale: float) -> GpuTrace:
    # 2 trace nodes per 8-GPU node: 4 GPUs per trace node, at most ``nodes`` nodes.
    tr = load_spot_trace(TRACE, 4, max_gpus=nodes * 8, time_scale=time_scale)
    return tr


def traced(setup: Setup, steps: int, time_scale: float) -> dict[str, Any]:
    """(b): every policy on the per-type traces."""
    cl = setup.cluster
    traces = {"h200": spot_trace(cl.nodes // 2, time_scale)}
    calib = default_calibration()
    out: dict[str, Any] = {"steps": steps, "h200_trace_changes": traces["h200"].changes,
                           "time_scale": time_scale, "policies": {}}
    runs: dict[str, MixedResult] = {}
    for policy in MIXED_POLICIES:
        variants = ([(policy, None)] if policy != "vendor-blind"
                    else [(f"vendor-blind-as-{t.name}", t) for t in cl.types])
        for label, t in variants:
            t0 = time.perf_counter()
            kw = {"blind": t} if t is not None else {"fast": H200}
            res = simulate_mixed(setup, traces, steps, policy, calib, **kw)
            runs[label] = res
            out["policies"][label] = {**res.summary(), "sim_wall_s": time.perf_counter() - t0}
    base = runs["vendor-aware"]
    for label, res in runs.items():
        row = out["policies"][label]
        row["mean_step_vs_vendor_aware"] = res.mean_step_s / base.mean_step_s
        row["makespan_vs_vendor_aware"] = res.makespan_s / base.makespan_s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    args = ap.parse_args()
    setup = mixed_setup(8)
    steps = 12 if args.quick else 60
    result = {"cluster": "8 nodes x 8 h200 (spot) + 8 nodes x 8 mi300x (reserved)",
              "job": "llama-3.1-8b ppo sync, 512 prompts x (1024 + 2048 tokens, p95 4096)",
              "one_pool": one_pool(setup), "traced": traced(setup, steps, 0.1)}
    if args.json:
        print(json.dumps(result))
        return
    a = result["one_pool"]
    print(f"(a) one pool, 128 GPUs; vendor-aware decision {a['decision_s']:.2f} s")
    for name, r in a["plans"].items():
        extra = (f", believed {r['believed_step_s']:.2f} s, {r['over_capacity_gpus']} GPUs over "
                 "capacity" if "believed_step_s" in r else "")
        print(f"  {name:<22} step {r['step_s']:7.2f} s  ×{r['vs_vendor_aware']:.3f}{extra}")
        print("      " + "; ".join(f"{k} {v}" for k, v in r["placement"].items()))
    b = result["traced"]
    print(f"(b) {b['steps']} steps, h200 spot trace ({b['h200_trace_changes']} changes), "
          "mi300x reserved")
    for name, r in b["policies"].items():
        print(f"  {name:<22} mean step {r['mean_step_s']:7.2f} s (×{r['mean_step_vs_vendor_aware']:.3f})"
              f"  transitions {r['transitions']:3d} ({r['transition_s']:.1f} s)"
              f"  restarts {r['restarts']}  wait {r['wait_s']:.0f} s"
              f"  makespan {r['makespan_s']:.0f} s (×{r['makespan_vs_vendor_aware']:.3f})")


if __name__ == "__main__":
    main()
