"""Losing one node of 128 in simulation: throughput before and after, over seeds (issues 20, 36,
37).

Llama-3.1-8B PPO (5 model-stages, rule-based reward), synchronous, 1,024 prompts (the 1,024-GPU
run of ``benchmarks/policies.py``) of 1,024 tokens, 2,048 generated tokens (p95 2,458), H200, 128
nodes of 8 GPUs. The GPU trace drops one node (1,024 → 1,016 GPUs) after the run's first half.
The simulator runs the nereus policy (the controller plans, the transition is planned and paid
for); true step times come from the shape truth (``nereus.sim.shape_truth``) with its noise and
stragglers on (``--noise-free``: off), one truth seed per run, and calibration learns from the
measured stage times. Throughput = prompts per second of step time over the steps before and
the steps after the loss (the first step of each part, which carries a transition, left out).

Plan spaces, same runs otherwise:

- ``planner``: what ``nereus plan`` and ``nereus simulate`` search (uneven DP, Megatron's uneven
  pipelines), time following the mean length;
- ``runtime``: what ``nereus run``'s controller searches (``nereus.config.run.runtime_setup``:
  since issue 37 the same space, costed with static batches — its engines pad each step's batch
  to its longest response, so time follows the p95 length);
- ``even``: the space ``nereus run`` searched before issue 37 (pp dividing the layers, DP
  dividing the batch), with static batches: the baseline the runtime work replaces.

Per space: the loss in % per seed, their mean and 95% interval, each model-stage's (dp, tp, pp)
before and after (first seed), and the model-stages whose **replicas** halved (dp after ≤ half dp
before, whatever their GPUs) in any seed. Target (issue 37): one node of 128 costs at most 3% in
the runtime's space over at least 5 noisy seeds.

    python benchmarks/node_loss.py [--json] [--steps N] [--seeds K] [--noise-free]
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from typing import Any

from nereus.config.run import runtime_setup
from nereus.cost.calibration import default_calibration
from nereus.sim.engine import SimConfig, simulate
from nereus.sim.goodput import mean_ci95
from nereus.sim.shape_truth import ShapeTruth
from nereus.sim.traces import GpuTrace, LengthPoint, LengthTrace
from nereus.spec.hardware import H200, ClusterSpec
from nereus.spec.job import JobSpec, PlanSpace, Setup
from nereus.spec.model import LLAMA_3_1_8B

NODES, GPN = 128, 8
EVEN = PlanSpace(pipeline="even", uneven_dp=False)


def setup_of(space: str, prompts: int) -> Setup:
    m = LLAMA_3_1_8B
    job = JobSpec("ppo", "sync", (("actor", m), ("critic", m), ("reference", m)),
                  global_batch=prompts, prompt_len=1024, gen_len=2048, gen_len_p95=2458,
                  reward_model=False)
    setup = Setup(job, ClusterSpec(NODES, GPN, H200))
    if space == "planner":
        return setup
    runtime = runtime_setup(setup)  # what nereus run's controller plans with
    if space == "runtime":
        return runtime
    return replace(runtime, job=replace(runtime.job, space=EVEN))


def _replicas(rec: Any) -> dict[str, tuple[int, int, int]]:
    out = {}
    for part in rec.plan.split():
        name, dims = part.split("=")
        dp, tp, pp = (int(x) for x in dims.strip("()").split(","))
        out[name] = (dp, tp, pp)
    return out


def run(space: str, steps: int, seed: int, prompts: int, noisy: bool) -> dict[str, Any]:
    setup = setup_of(space, prompts)
    lengths = LengthTrace((LengthPoint(0, 2048.0, 2458.0),))
    truth = ShapeTruth(seed=seed) if noisy else ShapeTruth(noise_rel=0.0, straggler_p=0.0,
                                                           seed=seed)
    # a first pass finds when the (steps // 2)-th step starts; the node leaves right after it
    probe = simulate(setup, GpuTrace((0.0,), (NODES * GPN,)), lengths,
                     SimConfig(steps=steps // 2 + 1, seed=seed), truth, default_calibration())
    t_loss = probe.records[-1].clock_s + 1e-6
    trace = GpuTrace((0.0, t_loss), (NODES * GPN, (NODES - 1) * GPN))
    res = simulate(setup, trace, lengths, SimConfig(steps=steps, seed=seed), truth,
                   default_calibration())
    before = [r for r in res.records if r.pool_gpus == NODES * GPN]
    after = [r for r in res.records if r.pool_gpus < NODES * GPN]
    b, a = before[1:], after[1:]  # the first step of each part carries its transition
    tput_before = prompts * len(b) / sum(r.step_s for r in b)
    tput_after = prompts * len(a) / sum(r.step_s for r in a)
    rb, ra = _replicas(before[-1]), _replicas(after[-1])
    return {
        "space": space, "seed": seed, "prompts": prompts, "noisy": noisy,
        "steps_before": len(b), "steps_after": len(a),
        "throughput_before": tput_before, "throughput_after": tput_after,
        "loss_pct": 100.0 * (1.0 - tput_after / tput_before),
        "transition_s": sum(r.transition_s for r in after[:1]),
        "plan_before": rb, "plan_after": ra,
        # the replicas criterion (issue 36): a model-stage left with half its replicas or fewer
        "halved": sorted(n for n in rb if 2 * ra[n][0] <= rb[n][0]),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    losses = [r["loss_pct"] for r in rows]
    mean, half = mean_ci95(losses)
    return {"space": rows[0]["space"], "seeds": [r["seed"] for r in rows], "loss_pct": losses,
            "mean_loss_pct": mean, "ci95_pct": half,
            "halved": sorted({n for r in rows for n in r["halved"]}),
            "plan_before": rows[0]["plan_before"], "plan_after": rows[0]["plan_after"],
            "transition_s": [r["transition_s"] for r in rows],
            "throughput_before": [r["throughput_before"] for r in rows],
            "throughput_after": [r["throughput_after"] for r in rows]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=1024)
    ap.add_argument("--noise-free", action="store_true", help="the truth's noise and stragglers "
                    "off (one seed is then enough: the runs are deterministic)")
    ap.add_argument("--spaces", default="planner,runtime,even")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    seeds = range(1 if args.noise_free else args.seeds)
    out = [summarize([run(space, args.steps, seed, args.prompts, not args.noise_free)
                      for seed in seeds]) for space in args.spaces.split(",")]
    if args.json:
        print(json.dumps({"rows": out, "steps": args.steps, "load_avg_1min": load}))
        return 0
    for r in out:
        per = ", ".join(f"{x:.2f}" for x in r["loss_pct"])
        print(f"{r['space']:>8}: {r['mean_loss_pct']:.2f}% ± {r['ci95_pct']:.2f} lost (seeds: "
              f"{per}); replicas halved: {r['halved'] or 'none'}")
        for n in r["plan_before"]:
            print(f"          {n:>13} (dp,tp,pp) {r['plan_before'][n]} → {r['plan_after'][n]}")
    print(f"{args.steps} steps per run, the node leaves after step {args.steps // 2}; "
          f"1-minute load average: {load:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
