"""``nereus inventory [--json] [--virtual-devices N] [--virtual-memory-gb X]``: devices, memory and
links of this node (run it under ``srun`` for one report per node)."""

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
    from nereus.cluster.env import from_os_environ
    from nereus.cluster.inventory import node_inventory

    fields.positive_int("--virtual-devices", args.virtual_devices, "MAX_GPUS_PER_NODE")
    fields.positive_float("--virtual-memory-gb", args.virtual_memory_gb, "MAX_MEMORY_GB")
    # Under Slurm the node name (emulated nodes share one host name) comes from the job env.
    inv = node_inventory(node=from_os_environ().node_name, virtual_count=args.virtual_devices,
                         virtual_memory_bytes=int(args.virtual_memory_gb * 1e9))
    if args.json:
        print(json.dumps({"nodes": [inv.to_dict()]}, indent=2, sort_keys=True))
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
    return 0
