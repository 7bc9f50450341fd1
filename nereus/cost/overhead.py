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

from nereus.cost.calibration import Calibration
from nereus.cost.workload import StageContext, stage_groups
from nereus.spec.hardware import GpuSpec
from nereus.spec.plan import Candidate

STEP_EVENTS = ("layer-pass", "decode-layer", "decode-step", "micro-batch", "update")


def step_event_counts(ctx: StageContext, cand: Candidate) -> tuple[tuple[str, float], ...]:
    """The fixed-cost events of one step of ``ctx``'s model-stage under ``cand`` (on the slowest
    device of a replica), in :data:`STEP_EVENTS` order, zero counts left out."""
    pp, m = cand.pp, cand.grad_accum
    layers = max(n for _, n, _ in stage_groups(ctx.dims.num_layers, pp))
    slots = m + pp - 1
    u = ctx.updates
    out: list[tuple[str, float]] = []
    if ctx.kind == "generate":
        g = max(ctx.max_gen_len, ctx.gen_len)
        out += [("layer-pass", float(slots * layers)), ("decode-layer", float(slots * layers * g)),
                ("decode-step", float(slots * g)), ("micro-batch", float(slots))]
    else:
        passes = 1 if ctx.kind == "forward" else (4 if cand.recompute else 3)
        out += [("layer-pass", float(u * slots * layers * passes)),
                ("micro-batch", float(u * slots))]
        if ctx.kind == "train":
            out.append(("update", float(u)))
    return tuple((k, n) for k, n in out if n > 0)


def fixed_time_s(counts: tuple[tuple[str, float], ...], gpu: GpuSpec, calib: Calibration) -> float:
    """Seconds the events ``counts`` cost on ``gpu`` under ``calib``."""
    return sum(n * calib.fixed_s(gpu, k) for k, n in counts)
