"""``nereus inventory [--json] [--virtual-devices N] [--virtual-memory-gb X]``: devices, memory and
links of this node (run it under ``srun`` for one report per node), what ``cluster.gpu: auto``
and ``runtime.device: auto`` would take here, and which code packs transfers (the compiled
kernels or the torch fallback)."""

from __future__ import annotations

import argparse
import json

from nereus.config import fields


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("inventory", help="devices, memory and links of this node",
                              description=__doc__)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--virtual-devices", type=int, default=2, metavar="N",
                   help="CPU virtual devices when no GPU driver is present (default 2)")
    p.add_argument("--virtual-memory-gb", type=float, default=2.0, metavar="X",
                   help="memory of each CPU virtual device in GB (1e9 bytes; default 2)")
    p.set_defaults(func=handle)


def _gb(n_bytes: int) -> str:
    return f"{n_bytes / 1e9:.1f} GB"


def handle(args: argparse.Namespace) -> int:
    from nereus.cluster.devices import select_device
    from nereus.cluster.env import from_os_environ
    from nereus.cluster.inventory import node_inventory
    from nereus.cluster.probe import describe_facts, detected_gpu, device_facts
    from nereus.runtime.execution.packer import describe_pack_path

    fields.positive_int("--virtual-devices", args.virtual_devices, "MAX_GPUS_PER_NODE")
    fields.positive_float("--virtual-memory-gb", args.virtual_memory_gb, "MAX_MEMORY_GB")
    # Under Slurm the node name (emulated nodes share one host name) comes from the job env.
    job = from_os_environ()
    inv = node_inventory(node=job.node_name, virtual_count=args.virtual_devices,
                         virtual_memory_bytes=int(args.virtual_memory_gb * 1e9))
    # What a rank started here would do: runtime.device auto with cluster.gpu auto.
    facts = device_facts(job, inv)
    gpu = detected_gpu(inv)
    choice = select_device("auto", facts, gpu.vendor)
    pack = describe_pack_path()
    if args.json:
        print(json.dumps({"nodes": [inv.to_dict()], "torch": describe_facts(facts),
                          "cluster_gpu_auto": gpu.name, "device": choice.to_dict(),
                          "pack": pack}, indent=2, sort_keys=True))
        return 0
    kinds = "+".join(inv.vendors)
    print(f"node {inv.node}: {len(inv.devices)} {kinds} device(s), {_gb(inv.memory_bytes)}"
          + (" (CPU virtual devices)" if inv.virtual else ""))
    if inv.notes:
        print("  why: " + "; ".join(inv.notes))
    for pos, dev in enumerate(inv.devices):
        bus = f" bus {dev.bus_id}" if dev.bus_id else ""
        print(f"  [{pos}] {dev.vendor}:{dev.index} {dev.name} {_gb(dev.memory_bytes)}{bus}")
    for link in inv.links:
        count = f" x{link.count}" if link.count else ""
        print(f"  link {link.a}-{link.b}: {link.kind}{count} ({link.detail})")
    print(f"torch: {facts.torch_build} build, {facts.visible} device(s) visible")
    print(f"cluster.gpu: auto → {gpu.name} ({gpu.vendor}, {_gb(gpu.memory_bytes)})")
    print(f"runtime.device: auto → {choice.torch_device} ({choice.reason})")
    print(f"pack kernels: {pack}")
    return 0
