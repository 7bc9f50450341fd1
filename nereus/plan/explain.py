"""Why a plan was chosen: critical path, per model-stage latency and per-GPU memory (text, JSON)."""

from __future__ import annotations

from typing import Any

from nereus.cost.calibration import Calibration, default_calibration
from nereus.cost.memory import MemoryBreakdown, memory_capacity_bytes, rank_memory
from nereus.plan.search import PlanResult
from nereus.spec.job import Setup

GB = 1e9


def _gb(x: float) -> str:
    return f"{x / GB:.1f}"


def critical_path(result: PlanResult, setup: Setup) -> list[str]:
    """Lines: each lane's phases, their time and the model-stage that sets it."""
    lat = {s.name: s.total_s for s in result.stage_latencies}
    lanes = setup.job.workflow.lanes
    totals = [sum(max(lat[n] for n in phase) for phase in lane) for lane in lanes]
    critical = max(range(len(lanes)), key=lambda i: totals[i])
    lines = []
    for i, lane in enumerate(lanes):
        steps = []
        for phase in lane:
            slowest = max(phase, key=lambda n: lat[n])
            others = f" (with {', '.join(n for n in phase if n != slowest)})" if len(phase) > 1 else ""
            steps.append(f"{slowest} {lat[slowest]:.3f} s{others}")
        mark = "critical " if i == critical and len(lanes) > 1 else ""
        lines.append(f"  {mark}lane {i}: " + " → ".join(steps) + f"  = {totals[i]:.3f} s")
    return lines


def _placed_on(result: PlanResult, gpu: int) -> list[tuple[str, int]]:
    """(model-stage, pp_rank) of every replica position on ``gpu``."""
    out = []
    for sp in result.plan.stages:
        for rep in sp.replicas:
            for pos, g in enumerate(rep):
                if g == gpu:
                    out.append((sp.name, pos // sp.tp))
    return out


def _breakdown_row(label: str, mb: MemoryBreakdown) -> str:
    return (
        f"    {label:<22} weights {_gb(mb.weights_bytes):>6}  grads {_gb(mb.grads_bytes):>6}  "
        f"adam {_gb(mb.optimizer_bytes):>6}  act {_gb(mb.activations_bytes):>6}  "
        f"kv {_gb(mb.kv_cache_bytes):>6}  ws {_gb(mb.workspace_bytes):>4} GB"
    )


def by_type(result: PlanResult, setup: Setup) -> list[str]:
    """Lines: per hardware type of a mixed cluster, what the plan runs there and why the
    model-stages that cross types do (empty on one type)."""
    cl = setup.cluster
    if not cl.heterogeneous:
        return []
    from nereus.plan.hetero import placement_by_type, typed_setup

    lines = ["placement per hardware type (each unit on one type; costed with its own spec and "
             "calibration):"]
    for share in placement_by_type(cl, result.plan):
        t = share.gpu
        cap = memory_capacity_bytes(typed_setup(setup, t))
        lines.append(
            f"  {t.name} ({t.plays}, {_gb(cap)} GB usable): {len(share.used_gpus)} of "
            f"{len(cl.gpus_of(t))} GPUs — {', '.join(share.stages) or 'idle'}")
    for sp in result.plan.stages:
        names = sorted({cl.type_name(g) for g in sp.gpus})
        if len(names) > 1:
            vendors = {cl.gpu_of(g).plays for g in sp.gpus}
            link = "host transport" if len(vendors) > 1 else "inter-node link"
            why = (f"gradient sync over the {link}, and still faster" if
                   setup.job.workflow.by_name(sp.name).trainable else "no gradient sync; faster")
            lines.append(f"  {sp.name}: DP replicas span {', '.join(names)} ({why}: the cost "
                         "model's choice; each replica costed on its own type, the slowest sets "
                         "the time)")
    for sl in result.stage_latencies:
        w = sl.component("weight_sync")
        if w > 0:
            lines.append(f"  {sl.name}: reads weights trained on another type: weight sync "
                         f"{w:.3f} s per step over the link between them "
                         f"(host transport between vendors, {cl.host_gbps:g} GB/s per pair)")
    return lines


def explain(result: PlanResult, setup: Setup, calib: Calibration | None = None) -> str:
    """A table for people: the plan, why it is fast, and where its memory goes."""
    calib = calib if calib is not None else default_calibration()
    wf = setup.job.workflow
    cl = setup.cluster
    peaks = dict(result.gpu_peak_bytes)
    used = sorted(peaks)
    lines = [
        f"plan ({result.method}): predicted step {result.predicted_step_s:.3f} s, "
        f"peak {_gb(result.peak_memory_bytes)} GB of {_gb(result.capacity_bytes)} GB usable per GPU, "
        f"{len(used)} GPUs used, {result.candidates_considered} candidates considered",
        "critical path (lanes concurrent, phases in sequence, model-stages of a phase concurrent):",
        *critical_path(result, setup),
        *by_type(result, setup),
        "model-stages:",
        f"  {'name':<14}{'tp':>3}{'pp':>4}{'dp':>5}{'b':>5}{'a':>5} {'rc':<3}{'gpus':>6}"
        f"{'latency s':>11}  components (s)",
    ]
    lat = {s.name: s for s in result.stage_latencies}
    for sp in result.plan.stages:
        sl = lat[sp.name]
        comps = ", ".join(f"{k} {v:.3f}" for k, v in sl.components if v > 0)
        lines.append(
            f"  {sp.name:<14}{sp.tp:>3}{sp.pp:>4}{sp.dp:>5}{sp.micro_batch:>5}{sp.grad_accum:>5} "
            f"{'y' if sp.recompute else 'n':<3}{sp.num_gpus:>6}{sl.total_s:>11.3f}  {comps}"
        )
    lines.append("memory: the most loaded GPU of each model-stage (persistent state of every")
    lines.append("model-stage placed there adds up; transient bytes only while it runs):")
    gpn = setup.cluster.gpus_per_node
    shown: dict[int, str] = {}
    for sp in result.plan.stages:
        gpu = max(sp.gpus, key=lambda g: (peaks.get(g, 0), -g))
        on = setup
        cap = result.capacity_bytes
        where = f"node {gpu // gpn}"
        if cl.heterogeneous:
            from nereus.plan.hetero import typed_setup

            on = typed_setup(setup, cl.gpu_of(gpu))
            cap = memory_capacity_bytes(on)
            where += f", {cl.type_name(gpu)}"
        head = (
            f"  {sp.name}: GPU {gpu} ({where}) {_gb(peaks.get(gpu, 0))} GB "
            f"of {_gb(cap)} GB"
        )
        if gpu in shown:
            lines.append(f"{head}, as for {shown[gpu]}")
            continue
        shown[gpu] = sp.name
        lines.append(head)
        for name, pp_rank in _placed_on(result, gpu):
            other = result.plan.stage(name)
            mb = rank_memory(on, wf.by_name(name), other.candidate, calib, pp_rank)
            lines.append(_breakdown_row(f"{name} pp{pp_rank}", mb))
    return "\n".join(lines)


def plan_result_to_json(result: PlanResult, setup: Setup | None = None) -> dict[str, Any]:
    """The plan as plain JSON data (the CLI adds ``decision_ms``); with ``setup`` of a mixed
    cluster also ``hardware`` (per model-stage: its types) and ``types`` (per type: GPUs,
    used GPUs, model-stages)."""
    lat = {s.name: s for s in result.stage_latencies}
    mem = dict(result.stage_memory)
    stages: list[dict[str, Any]] = []
    for sp in result.plan.stages:
        sl = lat[sp.name]
        stages.append(
            {
                "name": sp.name,
                "tp": sp.tp,
                "pp": sp.pp,
                "dp": sp.dp,
                "micro_batch": sp.micro_batch,
                "grad_accum": sp.grad_accum,
                "recompute": sp.recompute,
                "gpus": list(sp.gpus),
                "replicas": [list(r) for r in sp.replicas],
                "latency_s": sl.total_s,
                "components_s": dict(sl.components),
                "peak_bytes": mem[sp.name].peak_bytes,
            }
        )
    extra: dict[str, Any] = {}
    if setup is not None and setup.cluster.heterogeneous:
        from nereus.plan.hetero import placement_by_type

        cl = setup.cluster
        for st, sp in zip(stages, result.plan.stages, strict=True):
            st["hardware"] = sorted({cl.type_name(g) for g in sp.gpus})
        extra["types"] = [
            {"gpu": sh.gpu.name, "vendor": sh.gpu.vendor, "gpus": len(cl.gpus_of(sh.gpu)),
             "used_gpus": list(sh.used_gpus), "model_stages": list(sh.stages)}
            for sh in placement_by_type(cl, result.plan)]
    return {
        **extra,
        "feasible": True,
        "method": result.method,
        "predicted_step_s": result.predicted_step_s,
        "peak_memory_bytes": result.peak_memory_bytes,
        "capacity_bytes": result.capacity_bytes,
        "candidates_considered": result.candidates_considered,
        "model_stages": stages,
        "gpu_peak_bytes": {str(g): b for g, b in result.gpu_peak_bytes},
    }


def infeasible_to_json(reason: str) -> dict[str, Any]:
    """The JSON answer when no plan fits."""
    return {"feasible": False, "reason": reason}
