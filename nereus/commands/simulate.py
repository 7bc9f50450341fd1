"""``nereus simulate [CONFIG] --gpu-trace FILE --length-trace FILE --steps N --policy P``.

Runs the real controller, planner and transition-DAG code over a virtual cluster whose GPU pool
follows a trace (spot-trace or fault-trace JSON) and whose generated length follows a CSV trace
(``step,mean,p95``) or a built-in paper trace (``paper:25-step``, ``paper:1000-step``). True step
times come from a truth of its own form (``--truth``: shape-dependent efficiency from the measured
H200 op table, stragglers and noise by default; or replayed measured stage times), so calibration
must learn them.
Also takes ``nereus plan``'s model and cluster flags.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from nereus.errors import ConfigError


def _progress(enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except Exception:
        return None
    bar = None

    def tick(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc="simulate", unit="step", file=sys.stderr, leave=False)
        bar.update(1)
        if done == total:
            bar.close()

    return tick


def load_gpu_trace(path: str, gpus_per_trace_node: int, max_gpus: int, fault_nodes: int,
                   time_scale: float = 1.0) -> Any:
    """A fault trace (a JSON list of events) or a spot trace (an object)."""
    from pathlib import Path

    from nereus.sim.traces import fault_trace, read_trace_json, spot_trace

    doc = read_trace_json(path, "--gpu-trace")
    if isinstance(doc, list):
        return fault_trace(doc, Path(path), fault_nodes, gpus_per_trace_node, time_scale)
    return spot_trace(doc, Path(path), gpus_per_trace_node, max_gpus, time_scale)


def load_truth(spec: str, noise: float, seed: int, gpu: Any) -> tuple[Any, Any]:
    """The truth named by ``--truth`` and, for a verl step log, the length trace it carries."""
    from nereus.cost.calibration import default_calibration
    from nereus.sim.shape_truth import ShapeTruth
    from nereus.sim.truth import HiddenTruth, hidden_calibration

    if spec == "shape":
        return ShapeTruth(noise_rel=noise, seed=seed), None
    if spec == "planner":
        return HiddenTruth(hidden_calibration(default_calibration(), gpu, seed), noise, seed), None
    if spec.startswith("replay:"):
        from nereus.sim.replay import ReplayTruth, load_run_log, load_verl_steps

        path = spec.split(":", 1)[1]
        if path.endswith(".csv"):
            measured, lengths = load_verl_steps(path)
            return ReplayTruth(measured, ShapeTruth(noise_rel=noise, seed=seed)), lengths
        return ReplayTruth(load_run_log(path), ShapeTruth(noise_rel=noise, seed=seed)), None
    raise ConfigError("--truth", spec, "must be shape, planner or replay:FILE (.csv verl log, .h5 run log)")


def load_lengths(spec: str) -> Any:
    from nereus.sim.traces import load_length_trace, paper_length_trace

    if spec.startswith("paper:"):
        return paper_length_trace(spec.split(":", 1)[1])
    return load_length_trace(spec)


def trigger_name(triggers: tuple[str, ...], limit: int = 32) -> str:
    """The triggers as one log name of at most ``limit`` characters: joined by commas, or the
    first with the count of the others when that is too long."""
    joined = ",".join(triggers)
    if len(joined) <= limit:
        return joined
    more = f"+{len(triggers) - 1}"
    return triggers[0][: limit - len(more)] + more


def write_log(writer: Any, result: Any) -> None:
    """The simulated run as a run log: steps, admissions, transitions, pool changes."""
    last_pool = None
    for r in result.records:
        if last_pool is not None and r.pool_gpus != last_pool:
            writer.log_event(r.step, "gpu-pool-change", {"from": last_pool, "to": r.pool_gpus}, time_s=r.clock_s)
        last_pool = r.pool_gpus
        if r.triggers:
            options = (r.admission or {}).get("options", [])  # every target considered
            writer.log_replan(r.step, trigger_name(r.triggers), options,
                              {"current_step_s": r.predicted_step_s,
                               "options_s": [o["step_s"] for o in options]}, {})
        if r.admission is not None and r.admission["path"] != "initial":
            a = r.admission
            writer.log_admission(r.step, a["admitted"], a["path"], a["reason"], a["delta_l_s"],
                                 a["transition_s"], a["horizon_steps"])
        if r.event in ("transition", "restart"):
            writer.log_transition(r.step, {"kind": r.event, "executor": r.executor}, [], 0,
                                  r.transition_s, r.transition_s, r.plan_dict)
        writer.log_step(r.step, step_s=r.step_s, gen_len_mean=r.gen_len, pool_gpus=r.pool_gpus,
                        wall_time_s=r.clock_s, flush=False)
    writer.flush()


def check_flags(args: argparse.Namespace) -> None:
    """The numeric flags in range (finite, not huge; :mod:`nereus.config.limits`)."""
    from nereus.config import fields as f

    f.positive_int("--steps", args.steps, "MAX_SIM_STEPS")
    f.non_negative_float("--gamma", args.gamma)
    f.positive_int("--every-k", args.every_k, "MAX_SIM_STEPS")
    f.positive_int("--gpus-per-trace-node", args.gpus_per_trace_node, "MAX_GPUS_PER_NODE")
    if args.max_gpus is not None:
        f.positive_int("--max-gpus", args.max_gpus, "MAX_GPUS")
    f.non_negative_int("--seed", args.seed, "MAX_SEED")
    f.fraction("--noise", args.noise, closed_low=True, closed_high=True)


def _outputs(args: argparse.Namespace) -> tuple[Any, Any]:
    """The --log and --save-calibration files, checked before anything runs."""
    from nereus.log.outputs import NewFile, check_distinct

    log = NewFile(args.log, "--log") if args.log is not None else None
    calib = NewFile(args.save_calibration, "--save-calibration") \
        if args.save_calibration is not None else None
    check_distinct([o for o in (log, calib) if o is not None])
    return log, calib


def _handler(args: argparse.Namespace) -> int:
    from nereus.commands.plan import build_setup
    from nereus.cost.calibration import default_calibration
    from nereus.sim.engine import SimConfig, simulate
    from nereus.sim.truth import conservative_calibration

    check_flags(args)
    setup = build_setup(args)
    if setup.cluster.heterogeneous:
        raise ConfigError("cluster.nodes", "+".join(f"{g.count}×{g.gpu.name}"
                                                    for g in setup.cluster.groups),
                          "nereus simulate takes one GPU trace for one hardware type; mixed pools "
                          "run in nereus.sim.mixed (a trace per type: benchmarks/hetero.py)")
    max_gpus = args.max_gpus if args.max_gpus is not None else setup.cluster.num_gpus
    log_out, calib_out = _outputs(args)
    trace = load_gpu_trace(args.gpu_trace, args.gpus_per_trace_node, max_gpus, setup.cluster.nodes,
                           args.trace_time_scale)
    cfg = SimConfig(steps=args.steps, policy=args.policy, gamma=args.gamma, every_k=args.every_k,
                    seed=args.seed, samples=args.samples)
    gpu = setup.cluster.gpu
    truth, logged_lengths = load_truth(args.truth, args.noise, args.seed, gpu)
    if args.length_trace == "truth":
        if logged_lengths is None:
            raise ConfigError("--length-trace", "truth", "only a replayed verl step log carries lengths")
        lengths = logged_lengths
    else:
        lengths = load_lengths(args.length_trace)
    if args.calibration is not None:
        from nereus.log.calibration_store import load_calibration

        start = load_calibration(args.calibration)
    else:
        start = conservative_calibration(gpu.name) if args.conservative_start else default_calibration()
    result = simulate(setup, trace, lengths, cfg, truth, start, progress=_progress(not args.json))
    _write_outputs(args, cfg, result, log_out, calib_out)
    if args.json:
        print(json.dumps(result.summary()))
        return 0
    print(f"policy {result.policy}: {result.steps} steps, mean step {result.mean_step_s:.2f} s "
          f"(transitions included), total {result.total_s:.1f} s")
    print(f"transitions: {result.transitions}, {result.transition_s:.2f} s "
          f"({100 * result.transition_s / max(result.total_s, 1e-9):.3f}% of run time); "
          f"waited {result.wait_s:.0f} s for GPUs; {result.pool_changes} pool changes in the run")
    for r in result.records:
        if r.event:
            print(f"  step {r.step:5d}  {r.pool_gpus:4d} GPUs  len {r.gen_len:7.1f}  "
                  f"{r.event:10s} {r.transition_s:8.2f} s  {r.plan}")
    return 0


def _write_outputs(args: argparse.Namespace, cfg: Any, result: Any, log_out: Any,
                   calib_out: Any) -> None:
    """The run log and the calibration, both complete or neither (nereus.log.outputs)."""
    from nereus.log.outputs import publish_all

    outs = [o for o in (log_out, calib_out) if o is not None]
    try:
        if log_out is not None:
            from nereus.log.writer import RunLogWriter

            meta = {"kind": "simulation", "policy": cfg.policy, "steps": cfg.steps,
                    "seed": cfg.seed, "gpu_trace": args.gpu_trace,
                    "length_trace": args.length_trace}
            first = result.records[0].plan_dict
            with RunLogWriter(log_out.path, meta, {"argv": sys.argv[1:]}, initial_plan=first,
                              memory=True) as writer:
                write_log(writer, result)
            log_out.write(writer.image())
        if calib_out is not None:
            from nereus.log.calibration_store import calibration_json

            calib_out.write(calibration_json(result.final_calibration))
        publish_all(outs)
    finally:
        for out in outs:
            out.discard()


def register(subparsers: Any) -> None:
    from nereus.commands.plan import add_job_flags
    from nereus.sim.engine import POLICIES, SAMPLES

    p = subparsers.add_parser("simulate", help="simulate an adaptive run over GPU and length traces")
    p.add_argument("config", nargs="?", metavar="CONFIG", help="YAML job config")
    add_job_flags(p)
    p.add_argument("--gpu-trace", required=True, dest="gpu_trace", help="spot-trace or fault-trace JSON")
    p.add_argument("--length-trace", required=True, dest="length_trace",
                   help="CSV step,mean,p95 or paper:25-step | paper:1000-step | truth (the "
                        "lengths of a replayed verl step log)")
    p.add_argument("--truth", default="shape",
                   help="shape (shape-dependent efficiency, stragglers, noise; default), planner "
                        "(the cost model with hidden efficiencies) or replay:FILE (measured stage "
                        "times of a verl step log .csv or a nereus run log .h5)")
    p.add_argument("--samples", choices=SAMPLES, default="stages",
                   help="calibrate from measured stage times (default) or profiled op samples")
    p.add_argument("--trace-time-scale", type=float, default=1.0, dest="trace_time_scale",
                   help="multiply GPU-trace times (< 1 compresses); fault traces are rebased so "
                        "their first event falls at the run's start")
    p.add_argument("--steps", type=int, required=True, help="steps to simulate")
    p.add_argument("--policy", choices=POLICIES, default="nereus")
    p.add_argument("--gamma", type=float, default=0.5, help="payback fraction γ (nereus policy)")
    p.add_argument("--every-k", type=int, default=10, dest="every_k", help="k of the every-k policy")
    p.add_argument("--gpus-per-trace-node", type=int, default=8, dest="gpus_per_trace_node")
    p.add_argument("--max-gpus", type=int, dest="max_gpus", help="cap on the pool (default: cluster size)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise", type=float, default=0.02, help="relative noise of true step times")
    p.add_argument("--conservative-start", action="store_true", dest="conservative_start",
                   help="start calibration at 0.3 of peak for every op class")
    p.add_argument("--calibration", help="start from a saved calibration (JSON)")
    p.add_argument("--save-calibration", dest="save_calibration",
                   help="write the calibration learned by the run (JSON)")
    p.add_argument("--log", help="write the run as an HDF5 run log (read it with nereus report)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_handler)
