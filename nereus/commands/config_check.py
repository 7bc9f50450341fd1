"""``nereus config check FILE``: validate a YAML job config and print a one-line summary."""

from __future__ import annotations

import argparse
from typing import Any

from nereus.spec.job import Setup


def summary(setup: Setup) -> str:
    """``ppo sync, 6 model-stages (actor-gen, ...), 64 GPUs (8 nodes × 8 h200, 141 GB each)``."""
    job, cluster = setup.job, setup.cluster
    names = job.workflow.names
    gb = cluster.gpu.memory_bytes / 1e9
    if cluster.heterogeneous:
        parts = ", ".join(f"{g.count} nodes × {cluster.gpus_per_node} {g.gpu.name} "
                          f"({g.gpu.plays}, {g.gpu.memory_bytes / 1e9:g} GB each)"
                          for g in cluster.groups)
        return (f"{job.algorithm} {job.mode}, {len(names)} model-stages ({', '.join(names)}), "
                f"{cluster.num_gpus} GPUs ({parts})")
    return (
        f"{job.algorithm} {job.mode}, {len(names)} model-stages ({', '.join(names)}), "
        f"{cluster.num_gpus} GPUs ({cluster.nodes} nodes × {cluster.gpus_per_node} "
        f"{cluster.gpu.name}, {gb:g} GB each)"
    )


def _check(args: argparse.Namespace) -> int:
    from nereus.cluster.probe import detected_gpu
    from nereus.config import load_config

    config = load_config(args.file, detect_gpu=detected_gpu)
    actor = config.checkpoint("actor")
    if actor is not None:  # its tokenizer fits the vocabulary (loaded, never the weights)
        from nereus.hf.tokenizer import load_codec

        load_codec(actor)
    print(f"OK {args.file}: {summary(config.setup)}")
    return 0


def register(subparsers: Any) -> None:
    config = subparsers.add_parser("config", help="work with YAML job configs")
    actions = config.add_subparsers(dest="config_command", metavar="ACTION")
    actions.required = True
    check = actions.add_parser("check", help="validate a config; exit 2 on the first error")
    check.add_argument("file", metavar="FILE", help="YAML job config")
    check.set_defaults(func=_check)
