"""Losing one node of 128 in simulation: throughput before and after (issue 20).

Llama-3.1-8B PPO (5 model-stages, rule-based reward), synchronous, 1,024 prompts (the 1,024-GPU
run of ``benchmarks/policies.py``) of 1,024 tokens, 2,048 generated tokens (p95 2,458), H200, 128
nodes of 8 GPUs. The GPU trace drops one node
(1,024 → 1,016 GPUs) after the run's first steps. The simulator runs the nereus policy (the
controller plans, the transition is planned and paid for); true step times come from the shape
truth (``nereus.sim.shape_truth``; ``--noisy``: with its noise and stragglers, whose step-to-step
spread, ±10% at a 2% straggler chance per replica over 100+ replicas, needs many steps to average
out) and calibration learns from measured stage times. Throughput = prompts per second of step time over the steps before and the steps
after the loss (transitions excluded from both; their cost is printed). Two plan spaces, same
run otherwise:

- ``uneven``: the planner's space (any DP degree, uneven pipelines);
- ``runtime``: DP degrees dividing the batch and pipelines of equal stages (what the runtime
  executes; before issue 20 the only space).

Also printed: each model-stage's (dp, tp, pp) before and after, and which model-stages were left
with half their GPUs or fewer. Target: losing one node of 128 costs at most 3% of the
throughput, and no model-stage's replicas halve.

    python benchmarks/node_loss.py [--json] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any

from nereus.cost.calibration import default_calibration
from nereus.sim.engine import SimConfig, simulate
from nereus.sim.shape_truth import ShapeTruth
from nereus.sim.traces import GpuTrace, LengthPoint, LengthTrace
from nereus.spec.hardware import H200, ClusterSpec
from nereus.spec.job import RUNTIME_PLAN_SPACE, JobSpec, PlanSpace, Setup
from nereus.spec.model import LLAMA_3_1_8B

NODES, GPN = 128, 8


def run(space: PlanSpace, steps: int, seed: int, prompts: int, noisy: bool) -> dict[str, Any]:
    m = LLAMA_3_1_8B
    job = JobSpec("ppo", "sync", (("actor", m), ("critic", m), ("reference", m)),
                  global_batch=prompts, prompt_len=1024, gen_len=2048, gen_len_p95=2458,
                  reward_model=False, space=space)
    setup = Setup(job, ClusterSpec(NODES, GPN, H200))
    lengths = LengthTrace((LengthPoint(0, 2048.0, 2458.0),))
    truth = ShapeTruth(seed=seed) if noisy else ShapeTruth(noise_rel=0.0, straggler_p=0.0, seed=seed)
    # a first pass finds when the (steps // 2)-th step starts; the node leaves right after it
    probe = simulate(setup, GpuTrace((0.0,), (NODES * GPN,)), lengths,
                     SimConfig(steps=steps // 2 + 1, seed=seed), truth, default_calibration())
    t_loss = probe.records[-1].clock_s + 1e-6
    trace = GpuTrace((0.0, t_loss), (NODES * GPN, (NODES - 1) * GPN))
    res = simulate(setup, trace, lengths, SimConfig(steps=steps, seed=seed), truth,
                   default_calibration())
    before = [r for r in res.records if r.pool_gpus == NODES * GPN]
    after = [r for r in res.records if r.pool_gpus < NODES * GPN]
    # skip the first step of each part: it carries the transition into the new plan
    b, a = before[1:], after[1:]
    tput_before = prompts * len(b) / sum(r.step_s for r in b)
    tput_after = prompts * len(a) / sum(r.step_s for r in a)

    def replicas(recs: list[Any]) -> dict[str, tuple[int, int, int]]:
        plan = [r.plan for r in recs][-1]
        out = {}
        for part in plan.split():
            name, dims = part.split("=")
            dp, tp, pp = (int(x) for x in dims.strip("()").split(","))
            out[name] = (dp, tp, pp)
        return out

    rb, ra = replicas(before), replicas(after)
    return {
        "space": "uneven" if space.uneven_dp else "runtime", "prompts": prompts, "noisy": noisy,
        "steps_before": len(b), "steps_after": len(a),
        "throughput_before": tput_before, "throughput_after": tput_after,
        "loss_pct": 100.0 * (1.0 - tput_after / tput_before),
        "transition_s": sum(r.transition_s for r in after[:1]),
        "plan_before": rb, "plan_after": ra,
        # a model-stage left with half its GPUs or fewer (same-size replicas halved, or fewer)
        "halved": sorted(n for n in rb if 2 * math.prod(ra[n]) <= math.prod(rb[n])),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=1024)
    ap.add_argument("--noisy", action="store_true", help="the truth's noise and stragglers on")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    rows = [run(PlanSpace(), args.steps, args.seed, args.prompts, args.noisy),
            run(RUNTIME_PLAN_SPACE, args.steps, args.seed, args.prompts, args.noisy)]
    if args.json:
        print(json.dumps({"rows": rows, "load_avg_1min": load}))
        return 0
    for r in rows:
        print(f"{r['space']:>8}: {r['throughput_before']:.1f} → {r['throughput_after']:.1f} "
              f"prompts/s ({r['loss_pct']:.2f}% lost; {r['steps_before']} + {r['steps_after']} "
              f"steps; transition {r['transition_s']:.2f} s); halved: {r['halved'] or 'none'}")
        for n in r["plan_before"]:
            print(f"          {n:>13} (dp,tp,pp) {r['plan_before'][n]} → {r['plan_after'][n]}")
    print(f"1-minute load average: {load:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
