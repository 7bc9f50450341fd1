"""Default efficiency per (hardware preset name, op class) before any calibration sample."""

from __future__ import annotations

from nereus.cost.h200_defaults import H200_EFFICIENCY
from nereus.cost.published_defaults import PUBLISHED_EFFICIENCY
from nereus.spec.hardware import GpuSpec

# The CPU virtual device (gloo ranks playing GPUs) was not measured: these are assumed starting
# points, refitted from the first steps of every run (nereus.runtime.rank0.loop). Dense torch
# matmuls on small models reach about half of the preset's nominal 50 GFLOP/s per rank;
# attention kernels and gloo loopback collectives are less regular and keep the conservative
# 0.3; streaming copies reach about half of the nominal 10 GB/s.
CPU_EFFICIENCY: dict[str, float] = {
    "gemm": 0.5,
    "attention": 0.3,
    "decode-memory": 0.5,
    "copy": 0.5,
}

# Hardware without an entry (a100-64gb, mi250x-gcd, user-defined), and classes an entry leaves
# out, start at CONSERVATIVE_EFFICIENCY.
DEFAULT_EFFICIENCIES: dict[str, dict[str, float]] = {
    "h200": H200_EFFICIENCY,
    "cpu": CPU_EFFICIENCY,
    **PUBLISHED_EFFICIENCY,
}


# Fixed costs (seconds per event, :mod:`nereus.cost.overhead`) before any measurement.
# Step events: "layer-pass" (one layer's forward for one micro-batch on one device; a backward
# counts two), "decode-layer" (one layer for one decoded token), "micro-batch" (one micro-batch
# slot of a pipeline stage: embedding, head, loss, the schedule's own work), "update" (one
# optimizer update). Transition events: "comm-setup" (one communicator created), "unit-build"
# (the model and optimizer of a new unit built on its devices by a DAG primitive, with its
# transfer group and wave), "reload-unit" (one unit rebuilt from gathered state when a change
# has no DAG: its model, optimizer and groups), "transition" (once per plan change: the plan's
# process groups, the ranks' agreement).
# Step events start at 0 everywhere (the planner's first plan comes from FLOPs and bytes, as
# the paper's model has it), communicator set-up and a reloaded unit at the preset's set-up
# figure; a run refits them from its measured times within a few steps. CPU ranks build units
# slowly (a Megatron model, its optimizer and gloo groups per unit: dispatch-bound): a
# transition's builds and its own fixed cost start from the README job's measured transitions
# (8 ranks on 2 cores under a load of about 8, 2026-12-03, the ranks' heaps frozen after start:
# DAGs of 11-14 primitives 0.40-0.62 s, gather+reload of 9 units 0.26-0.37 s), refitted by every
# run.
CPU_FIXED_S: dict[str, float] = {
    "unit-build": 4e-2,
    "reload-unit": 2.5e-2,
    "transition": 4e-2,
}

DEFAULT_FIXED_S: dict[str, dict[str, float]] = {
    "cpu": CPU_FIXED_S,
}


def default_fixed_s(gpu: GpuSpec, key: str) -> float:
    """The hardware's default seconds for fixed-cost event ``key`` (0 if none is known)."""
    got = DEFAULT_FIXED_S.get(gpu.name, {}).get(key)
    if got is not None:
        return got
    return gpu.comm_setup_s if key in ("comm-setup", "reload-unit") else 0.0
