"""Default op-class efficiencies of A100-80GB, H100-80GB and MI300X from public measurements.

Each figure is derived from a cited public measurement (data/SOURCES.md, "GPU presets"); a class
with no public measurement found is left out and starts at ``CONSERVATIVE_EFFICIENCY`` until
calibrated. ``tests/test_calibration.py`` recomputes every value from the figures below.

- ``gemm``: the Maximum Achievable Matmul FLOPS of each GPU (bf16, best shape found by
  ``mamf-finder.py``; stas00/ml-engineering, compute/accelerator/README.md, "Maximum Achievable
  Matmul FLOPS comparison table") times ``GEMM_SHAPE_FACTOR``: our H200 default is the median of
  Llama-3.1-8B layer GEMMs, 0.6524 of peak, where the same table gives the H100/H200 (same
  silicon) best shape 0.803; real layers reach 0.8125 of the best shape.
- ``attention``: ``gemm`` times ``ATTENTION_TO_GEMM``, the ratio of our measured H200 attention and
  GEMM defaults (0.2501 / 0.6524; no cross-vendor attention table was found).
- ``allreduce-intra``: the all-reduce bus bandwidth of 8 GPUs at large messages over the link:
  A100 SXM4 NVLink3 230–250 GB/s of 300 (nccl-tests reference table, Alaya NeW tech blog
  2026-05-06: midpoint 240); H100 SXM5 460–480 GB/s of 450 (same table; NVLink SHARP reduces in
  the switch, so the bus bandwidth exceeds the link: capped at ``MAX_LINK_EFFICIENCY``); MI300X
  xGMI usable ≈ 48 of 64 GB/s per link (AMD ROCm blog "Understanding RCCL Bandwidth and xGMI
  Performance on AMD Instinct MI300X", 2025-03-02).
- MI250X: no public GEMM, attention or collective measurement was found; ``mi250x-gcd`` keeps the
  conservative start for every class.
"""

from __future__ import annotations

from nereus.cost.h200_defaults import H200_EFFICIENCY

H200_MAMF_FRACTION = 0.803  # H100 SXM ("H200 is the same"): 794.5 of 989 TFLOP/s
GEMM_SHAPE_FACTOR = H200_EFFICIENCY["gemm"] / H200_MAMF_FRACTION
ATTENTION_TO_GEMM = H200_EFFICIENCY["attention"] / H200_EFFICIENCY["gemm"]
MAX_LINK_EFFICIENCY = 0.95

# MAMF efficiency (fraction of the theoretical peak) from the table cited above.
MAMF_FRACTION = {"a100-80gb": 0.869, "h100-80gb": 0.803, "mi300x": 0.514}
# All-reduce bus bandwidth / link bandwidth of 8 GPUs (sources above).
ALLREDUCE_INTRA = {
    "a100-80gb": 240.0 / 300.0,
    "h100-80gb": min(MAX_LINK_EFFICIENCY, 470.0 / 450.0),
    "mi300x": 48.0 / 64.0,
}


def _efficiencies(name: str) -> dict[str, float]:
    gemm = round(MAMF_FRACTION[name] * GEMM_SHAPE_FACTOR, 4)
    return {
        "gemm": gemm,
        "attention": round(gemm * ATTENTION_TO_GEMM, 4),
        "allreduce-intra": round(ALLREDUCE_INTRA[name], 4),
    }


PUBLISHED_EFFICIENCY: dict[str, dict[str, float]] = {
    name: _efficiencies(name) for name in ("a100-80gb", "h100-80gb", "mi300x")
}
