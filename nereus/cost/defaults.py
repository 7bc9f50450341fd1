"""Default efficiency per (hardware preset name, op class) before any calibration sample."""

from __future__ import annotations

from nereus.cost.h200_defaults import H200_EFFICIENCY
from nereus.cost.published_defaults import PUBLISHED_EFFICIENCY

# The CPU virtual device (gloo ranks playing GPUs) was not measured: these are assumed starting
# points, to be replaced by the EMA after the first steps. Dense torch matmuls on small models
# reach about half of the preset's nominal 50 GFLOP/s per rank; attention kernels and gloo
# loopback collectives are less regular and keep the conservative 0.3; streaming copies reach
# about half of the nominal 10 GB/s.
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
