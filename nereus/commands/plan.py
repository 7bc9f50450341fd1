"""``nereus plan [CONFIG] [flags]``: the fastest memory-feasible execution plan, explained.

Flags override the config; without a config the job is ``BUILTIN_JOB`` (docs/config.md, "nereus
plan"). The planner is pure; this shell reads the file, the flags and the clock.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from typing import Any

from nereus.config import limits
from nereus.config.cluster import GPU_OVERRIDES
from nereus.errors import ConfigError, InfeasiblePlanError

# The job planned when no CONFIG is given (every flag below still overrides it).
BUILTIN_JOB: dict[str, Any] = {
    "job": {
        "algorithm": "ppo",
        "mode": "sync",
        "global_batch": 256,
        "prompt_len": 1024,
        "gen_len": 2048,
        "reward_model": False,  # rule-based reward: no reward model to name on the command line
    },
    "models": {"actor": "llama-3.1-8b"},
    "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "h200"},
}
SEARCH_METHODS = ("dp", "exhaustive", "milp")

# Config field → the flag that set it, so that an error names what the user typed.
FLAG_OF_FIELD = {
    "job.algorithm": "--algo",
    "job.mode": "--mode",
    "job.gen_len": "--seq-len",
    "job.prompt_len": "--prompt-len",
    "job.global_batch": "--global-batch",
    "models.actor": "--model",
    "models.critic": "--model",
    "models.reference": "--model",
    "cluster.gpu": "--gpu",
    "cluster.gpus_per_node": "--gpus-per-node",
}
FLAG_DEST = {
    "--algo": "algo", "--mode": "mode", "--seq-len": "seq_len", "--prompt-len": "prompt_len",
    "--global-batch": "global_batch", "--model": "model", "--gpu": "gpu",
    "--gpus-per-node": "gpus_per_node",
}


def _section(raw: dict[str, Any], name: str) -> dict[str, Any]:
    """``raw[name]`` as a dict to write flags into."""
    value = raw.setdefault(name, {})
    if not isinstance(value, dict):
        raise ConfigError(name, value, "must be a mapping")
    return value


def apply_flags(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """A copy of the raw config with the command-line flags written over it."""
    raw = copy.deepcopy(raw)
    job, models, cluster = _section(raw, "job"), _section(raw, "models"), _section(raw, "cluster")
    if args.algo is not None:
        job["algorithm"] = args.algo
    if args.mode is not None:
        job["mode"] = args.mode
    if args.seq_len is not None:
        job["gen_len"] = args.seq_len
        job.pop("gen_len_p95", None)  # the config's p95 belonged to its own generated length
    if args.prompt_len is not None:
        job["prompt_len"] = args.prompt_len
    if args.global_batch is not None:
        job["global_batch"] = args.global_batch
    if args.model is not None:
        models["actor"] = models["reference"] = args.model
    algorithm = job.get("algorithm", "ppo")
    if algorithm == "ppo":
        if args.model is not None:
            models["critic"] = args.model
        elif "critic" not in models and "actor" in models:
            models["critic"] = models["actor"]  # --algo ppo on a config without a critic
    elif args.algo is not None:
        models.pop("critic", None)  # --algo grpo/remax: the config's critic is not used
    if args.gpu is not None and cluster.get("gpu") != args.gpu:
        cluster["gpu"] = args.gpu
        for key in GPU_OVERRIDES:  # the config's hardware overrides described its own GPU
            cluster.pop(key, None)
    if args.gpus_per_node is not None:
        cluster["gpus_per_node"] = args.gpus_per_node
    if args.gpus is not None and isinstance(cluster.get("nodes"), list):
        raise ConfigError("--gpus", args.gpus, "the cluster has node groups (cluster.nodes a "
                          "list): set their counts in the config")
    if args.gpus is not None:
        if args.gpus > limits.MAX_GPUS:
            raise ConfigError("--gpus", args.gpus,
                              f"must be at most {limits.named('MAX_GPUS', limits.MAX_GPUS)}")
        per_node = cluster.get("gpus_per_node", 8)
        if isinstance(per_node, int) and not isinstance(per_node, bool) and per_node > 0:
            if args.gpus <= 0 or (args.gpus > per_node and args.gpus % per_node):
                rule = (
                    f"must be a positive multiple of --gpus-per-node={per_node} "
                    f"(or at most {per_node}: part of one node)"
                )
                raise ConfigError("--gpus", args.gpus, rule)
            cluster["nodes"] = max(1, args.gpus // per_node)
    return raw


def plan_pool(args: argparse.Namespace, setup: Any) -> tuple[int, ...] | None:
    """GPUs the plan may use: all of the cluster, or the first ``--gpus`` of a partial node."""
    if args.gpus is not None and args.gpus < setup.cluster.num_gpus:
        return tuple(range(args.gpus))
    return None


def _flag_error(exc: ConfigError, args: argparse.Namespace) -> ConfigError:
    """The same error named after the flag, when a flag given on the command line set the field
    (a field the config lacks is the config's error, not that of a flag never given)."""
    flag = FLAG_OF_FIELD.get(exc.field)
    given = None if flag is None else getattr(args, FLAG_DEST[flag])
    if flag is not None and given is not None and given == exc.value:
        return ConfigError(flag, exc.value, exc.rule)
    return exc


def build_setup(args: argparse.Namespace) -> Any:
    from nereus.config import load_raw, parse_config
    from nereus.config.cluster import uses_auto_gpu

    raw = load_raw(args.config) if args.config else BUILTIN_JOB
    try:
        raw = apply_flags(raw, args)
        detected = None
        if uses_auto_gpu(raw):  # cluster.gpu: auto — this node's hardware
            from nereus.cluster.probe import detected_gpu

            detected = detected_gpu()
        from nereus.config.checkpoint_files import read_checkpoint

        return parse_config(raw, detected_gpu=detected, read_checkpoint=read_checkpoint).setup
    except ConfigError as exc:
        raise _flag_error(exc, args) from None


def _handler(args: argparse.Namespace) -> int:
    setup = build_setup(args)
    from nereus.plan.explain import explain, infeasible_to_json, plan_result_to_json
    from nereus.plan.search import search_plan

    calib = None
    if args.calibration is not None:
        from nereus.log.calibration_store import load_calibration

        calib = load_calibration(args.calibration)
    start_s = time.perf_counter()
    try:
        result = search_plan(setup, calib=calib, pool=plan_pool(args, setup), method=args.search)
    except InfeasiblePlanError as exc:
        if not args.json:
            raise
        decision_ms = (time.perf_counter() - start_s) * 1e3
        print(json.dumps({**infeasible_to_json(exc.reason), "decision_ms": decision_ms}))
        return 3
    decision_ms = (time.perf_counter() - start_s) * 1e3
    if args.json:
        print(json.dumps({**plan_result_to_json(result, setup), "decision_ms": decision_ms}))
    else:
        print(explain(result, setup))
        print(f"decision: {decision_ms:.2f} ms ({args.search})")
    sys.stdout.flush()
    return 0


def add_job_flags(p: argparse.ArgumentParser) -> None:
    """The flags that override a config's job and cluster (shared with ``nereus simulate``)."""
    p.add_argument("--model", metavar="NAME", help="preset for actor, reference and (ppo) critic")
    p.add_argument("--gpu", metavar="NAME", help="GPU preset (h200, a100-64gb, a100-80gb, h100-80gb, mi250x-gcd, mi300x, cpu)")
    p.add_argument(
        "--gpus", type=int, metavar="N",
        help="GPUs to plan on: a multiple of --gpus-per-node, or fewer (part of one node)",
    )
    for flag, dest, metavar, text in (
        ("--gpus-per-node", "gpus_per_node", "G", "GPUs per node"),
        ("--seq-len", "seq_len", "L", "mean generated tokens per response (job.gen_len)"),
        ("--prompt-len", "prompt_len", "P", "prompt tokens"),
        ("--global-batch", "global_batch", "B", "prompts per step"),
    ):
        p.add_argument(flag, type=int, dest=dest, metavar=metavar, help=text)
    p.add_argument("--algo", choices=("ppo", "grpo", "remax"), help="RL algorithm")
    p.add_argument("--mode", choices=("sync", "async"), help="synchronous or asynchronous RL")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan", help="find the fastest memory-feasible execution plan",
        description="Plan an RL job. Flags override CONFIG; without CONFIG a built-in PPO job "
        "(docs/config.md) is planned.",
    )
    p.add_argument("config", nargs="?", metavar="CONFIG", help="YAML job config")
    add_job_flags(p)
    p.add_argument("--search", choices=SEARCH_METHODS, default="dp", help="plan search method")
    p.add_argument("--calibration", metavar="FILE",
                   help="efficiencies learned by a run (nereus simulate --save-calibration)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_handler)
