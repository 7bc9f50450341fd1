"""Fixed costs of a model-stage's step: events that take time whatever their FLOPs and bytes.

The latency model (:mod:`nereus.cost.latency`) times work: FLOPs at a compute rate, bytes over a
link. A device also spends a fixed time per *event*: a layer's kernels launched for one
micro-batch, one decoded token's pass, one micro-batch through the schedule, one optimizer
update. On a GPU running large models these are small; on a CPU rank running a tiny model (or a
GPU decoding without CUDA graphs) they dominate. Counted on the slowest device of a replica per
step, each event costs ``Calibration.fixed_s(gpu, event)`` seconds, refitted from measured times
(:mod:`nereus.cost.fit`).

Counts, with ``u`` updates per step, ``m`` micro-batches (rounds) per update, ``pp`` pipeline
stages (``m + pp − 1`` schedule slots) and ``L`` the layers of the most loaded stage:
- ``layer-pass``: a forward of one layer for one micro-batch (a backward counts 2, recompute
  adds 1): ``u · (m + pp − 1) · L · (1 | 3 | 4)``; generation's prefill counts one per round;
- ``decode-layer``: one layer for one decoded token: ``(m + pp − 1) · L · g`` with ``g`` the
  decode steps of a round — its longest response (p95 generated tokens) on a static batch;
- ``decode-step``: one decoded token of a round (sampling, the loop): ``(m + pp − 1) · g``;
- ``micro-batch``: ``u · (m + pp − 1)``; ``update``: ``u`` (training only).
"""

from __future__ import annotations

import numpy as np

from nereus.cost.calibration import Calibration
from nereus.cost.workload import CandidateArrays, StageContext, split_arrays
from nereus.spec.hardware import GpuSpec
from nereus.spec.plan import Candidate

STEP_EVENTS = ("layer-pass", "decode-layer", "decode-step", "micro-batch", "update")


def step_event_arrays(ctx: StageContext, ca: CandidateArrays) -> dict[str, np.ndarray]:
    """The fixed-cost events of one step of ``ctx``'s model-stage for every candidate of ``ca``
    (on the slowest device of a replica: the most loaded pipeline stage)."""
    pp, m = ca.pp, ca.grad_accum.astype(np.float64)
    first, mid, last = split_arrays(ctx.dims.num_layers, pp)
    layers = np.maximum(np.maximum(first, mid), last).astype(np.float64)
    slots = m + pp - 1
    u = float(ctx.updates)
    zero = np.zeros(slots.shape)
    if ctx.kind == "generate":
        g = float(max(ctx.max_gen_len, ctx.gen_len))
        return {"layer-pass": slots * layers, "decode-layer": slots * layers * g,
                "decode-step": slots * g, "micro-batch": slots, "update": zero}
    passes = 1.0 if ctx.kind == "forward" else np.where(ca.recompute, 4.0, 3.0)
    return {"layer-pass": u * slots * layers * passes, "decode-layer": zero, "decode-step": zero,
            "micro-batch": u * slots, "update": zero + (u if ctx.kind == "train" else 0.0)}


def step_event_counts(ctx: StageContext, cand: Candidate) -> tuple[tuple[str, float], ...]:
    """:func:`step_event_arrays` of one candidate, in :data:`STEP_EVENTS` order, zero counts
    left out."""
    arrays = step_event_arrays(ctx, CandidateArrays.of([cand]))
    return tuple((k, float(arrays[k][0])) for k in STEP_EVENTS if arrays[k][0] > 0)


def fixed_time_s(counts: tuple[tuple[str, float], ...], gpu: GpuSpec, calib: Calibration) -> float:
    """Seconds the events ``counts`` cost on ``gpu`` under ``calib``."""
    return sum(n * calib.fixed_s(gpu, k) for k, n in counts)
