"""Default efficiency per (hardware preset name, op class) before any calibration sample."""

from __future__ import annotations

from nereus.cost.h200_defaults import H200_EFFICIENCY
from nereus.spec.hardware import GpuSpec

# The CPU virtual device (gloo ranks playing GPUs): a fit (nereus.cost.fit) of the stage and
# transition times of two runs of the README job (examples/ppo-tiny-cpu.yaml, 8 ranks on a
# 2-core host, 2026-12-03; benchmarks/RESULTS.md, *cost_fidelity*), rounded — starting points
# that every run refits from its own measurements. Tiny models keep the GEMMs at the nominal
# rate; gloo collectives and sends over loopback are latency-bound (a few % of nominal).
CPU_EFFICIENCY: dict[str, float] = {
    "gemm": 1.0,
    "attention": 0.3,
    "decode-memory": 0.33,
    "copy": 0.58,
    "allreduce-intra": 0.07,
    "allreduce-inter": 0.07,
    "p2p-intra": 0.02,
    "p2p-inter": 0.02,
}

# Hardware without an entry (a100-64gb, mi250x-gcd, user-defined) starts every class at
# CONSERVATIVE_EFFICIENCY.
DEFAULT_EFFICIENCIES: dict[str, dict[str, float]] = {
    "h200": H200_EFFICIENCY,
    "cpu": CPU_EFFICIENCY,
}


# Fixed costs (seconds per event, :mod:`nereus.cost.overhead`) before any measurement.
# Step events: "layer-pass" (one layer's forward for one micro-batch on one device; a backward
# counts two), "decode-layer" (one layer for one decoded token), "micro-batch" (one micro-batch
# slot of a pipeline stage: embedding, head, loss, the schedule's own work), "update" (one
# optimizer update). Transition events: "comm-setup" (one communicator created), "unit-build"
# (the model and optimizer of a new unit built on its devices), "transition" (once per plan
# change: the plan's process groups, the ranks' agreement).
# GPUs: launch overheads are small against the work of the models we plan (and CUDA graphs hide
# decode's), so the step events start at 0 and communicator set-up at the preset's figure; a run
# refits them from its measured times. CPU ranks (gloo, tiny models) are dispatch-bound: their
# figures are a fit of the README job's measured stage and transition times (8 ranks on 2 cores,
# benchmarks/RESULTS.md, *cost_fidelity*), refitted again by every run.
CPU_FIXED_S: dict[str, float] = {
    "layer-pass": 3e-5,
    "decode-layer": 5e-4,
    "decode-step": 1.2e-4,
    "micro-batch": 4e-5,
    "update": 1.8e-2,
    "unit-build": 1.1e-2,
    "transition": 6e-2,
}

DEFAULT_FIXED_S: dict[str, dict[str, float]] = {
    "cpu": CPU_FIXED_S,
}


def default_fixed_s(gpu: GpuSpec, key: str) -> float:
    """The hardware's default seconds for fixed-cost event ``key`` (0 if none is known)."""
    got = DEFAULT_FIXED_S.get(gpu.name, {}).get(key)
    if got is not None:
        return got
    return gpu.comm_setup_s if key == "comm-setup" else 0.0
