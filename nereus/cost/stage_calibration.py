"""Calibration from measured stage times (DESIGN.md §3, "Calibration").

A profiler gives op-level samples (``Calibration.with_time_sample``); often only the wall time of
a whole model-stage is known. This module attributes a measured stage time to the op classes of
the stage's predicted components, in proportion to their predicted share: with ``r = measured /
predicted``, every class present in the stage receives the sample "its work took r times its
predicted time", i.e. efficiency / r, blended in by the same EMA. Components are mapped to one
class each (compute and prefill → gemm, the largest share of their FLOPs; decode → decode-memory;
TP all-reduces → allreduce-intra; PP sends and DP all-reduces → the link they cross; the Adam step
→ copy); the pipeline bubble is idle time and carries no sample. The stage's prediction then
converges to its measured time; op-level samples, when present, separate the classes further.
"""

from __future__ import annotations

from nereus.cost.calibration import Calibration
from nereus.cost.fit import Sample
from nereus.cost.latency import StageLatency
from nereus.errors import ConfigError
from nereus.spec.hardware import GpuSpec, OpClass

COMPONENT_CLASS = {
    "compute": OpClass.GEMM,
    "prefill": OpClass.GEMM,
    "decode": OpClass.DECODE_MEMORY,
    "tp_comm": OpClass.ALLREDUCE_INTRA,
    "optimizer": OpClass.COPY,
}
LINK_COMPONENTS = {"pp_p2p": (OpClass.P2P_INTRA, OpClass.P2P_INTER),
                   "dp_sync": (OpClass.ALLREDUCE_INTRA, OpClass.ALLREDUCE_INTER)}


def classed(components: dict[str, float], inter_node: bool) -> list[tuple[OpClass, float]]:
    """``(op class, predicted seconds)`` of each of ``components`` that has a class (the
    pipeline bubble has none), in their order; ``inter_node``: PP and DP traffic crosses
    nodes."""
    out = []
    for comp, t in components.items():
        op = COMPONENT_CLASS.get(comp)
        if op is None and comp in LINK_COMPONENTS:
            op = LINK_COMPONENTS[comp][1 if inter_node else 0]
        if op is not None:
            out.append((op, t))
    return out


def stage_time_samples(
    latency: StageLatency,
    measured_s: float,
    gpu: GpuSpec,
    calib: Calibration,
    inter_node: bool = False,
) -> tuple[tuple[OpClass, float, float], ...]:
    """(op class, ideal_s, measured_s) samples equivalent to one measured stage time.

    ``latency`` is the stage's prediction under ``calib``; ``inter_node`` says whether its PP and
    DP traffic crosses nodes.
    """
    if not measured_s > 0:
        raise ConfigError(f"{latency.name}.measured_s", measured_s, "must be > 0")
    busy = {k: v for k, v in latency.components if k != "pp_bubble" and v > 0}
    predicted = sum(busy.values())
    if predicted <= 0:
        return ()
    idle = latency.total_s - predicted
    ratio = max(measured_s - idle, 1e-12) / predicted
    per_class: dict[OpClass, float] = {}
    for op, t in classed(busy, inter_node):
        per_class[op] = per_class.get(op, 0.0) + t
    out = []
    for op, t in sorted(per_class.items(), key=lambda kv: kv[0].value):
        ideal = t * calib.efficiency(gpu, op)
        out.append((op, ideal, t * ratio))
    return tuple(out)


def with_stage_time(
    calib: Calibration,
    latency: StageLatency,
    measured_s: float,
    gpu: GpuSpec,
    alpha: float,
    inter_node: bool = False,
) -> Calibration:
    """``calib`` after blending one measured stage time into its op-class efficiencies."""
    for op, ideal_s, sample_s in stage_time_samples(latency, measured_s, gpu, calib, inter_node):
        calib = calib.with_time_sample(gpu, op, ideal_s, sample_s, alpha)
    return calib


def stage_sample(latency: StageLatency, counts: tuple[tuple[str, float], ...], measured_s: float,
                 gpu: GpuSpec, calib: Calibration, inter_node: bool = False,
                 contention: float = 1.0) -> Sample:
    """One measured stage time as a fitting sample (:mod:`nereus.cost.fit`): the predicted
    components' work at 100% of peak per op class (the pipeline bubble spread over them: idle
    time stretches the busy classes alike), and the stage's fixed-cost event ``counts``
    (:func:`nereus.cost.overhead.step_event_counts`), both as stretched by CPU ranks sharing a
    host (``contention``: ``latency`` is already)."""
    busy = {k: v for k, v in latency.components
            if k not in ("pp_bubble", "fixed") and v > 0}
    total_busy = sum(busy.values())
    stretch = (total_busy + latency.component("pp_bubble")) / total_busy if total_busy > 0 \
        else 1.0
    ideal: dict[str, float] = {}
    for op, t in classed(busy, inter_node):
        ideal[op.value] = ideal.get(op.value, 0.0) + t * stretch * calib.efficiency(gpu, op)
    return Sample(tuple(sorted(ideal.items())), tuple((k, n * contention) for k, n in counts),
                  measured_s, latency.name)
