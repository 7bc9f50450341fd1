"""Per-GPU memory of a model-stage candidate and of a placed plan (llm-analysis style, §3).

Per GPU of pipeline rank ``i`` (``L_i`` layers, ``P_i`` parameters on one TP rank, see
``nereus.cost.workload``), with ``b`` = micro_batch, ``s`` = prompt + p95 generated tokens,
``h`` hidden size, ``a`` attention heads, ``t`` = tp, ``B`` = dtype bytes (bf16: 2):

- weights ``B · P_i``; training adds gradients ``B · P_i`` and Adam state ``12 · P_i`` (fp32
  master, m, v; no ZeRO sharding).
- training activations: without recompute ``s·b·h·(34 + 5·a·s/h)/t`` bytes per layer (Korthikanti
  et al. with sequence parallelism; it assumes the attention scores are materialized, i.e. no
  flash attention, and the 4h MLP of GPT), times ``L_i``, times the micro-batches in flight on
  rank ``i`` under 1F1B, ``min(pp − i, grad_accum)``; with full recompute ``2·s·b·h/t`` per layer
  (the sequence-parallel layer input) times ``L_i`` times in-flight, plus one layer's full
  activations of one micro-batch. The last rank adds fp32 logits of one micro-batch,
  ``4·b·s·V/t`` (V = 1 for a value head).
- inference: one layer's activations of one micro-batch (no-recompute formula) plus the logits.
- generation: KV cache ``2·b·s·⌈kv_heads/t⌉·head_dim·B·L_i`` per round in flight
  (``min(pp, grad_accum)`` rounds), plus one layer's prefill activations and the sampled logits.
- workspace: ``WORKSPACE_BYTES`` per GPU (cuBLAS/NCCL workspaces, allocator slack); the CPU
  virtual device uses ``CPU_WORKSPACE_BYTES`` (gloo buffers).

Every component is multiplied by ``calib.memory_factor(ms.name)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from nereus.cost.calibration import Calibration
from nereus.cost.workload import (
    MEMO_MAX,
    PipelineStage,
    Workload,
    check_candidate,
    stage_context,
    workload,
)
from nereus.errors import ConfigError
from nereus.spec.job import Setup
from nereus.spec.model import ADAM_FP32_BYTES_PER_PARAM
from nereus.spec.plan import Candidate, ExecutionPlan
from nereus.spec.workflow import ModelStage

GIB = 1 << 30
WORKSPACE_BYTES = 1 * GIB
CPU_WORKSPACE_BYTES = 64 << 20
LOGIT_BYTES = 4  # fp32 logits for the loss / log-probs


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the most loaded GPU of one replica of one model-stage."""

    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    kv_cache_bytes: int
    workspace_bytes: int

    @property
    def persistent_bytes(self) -> int:
        """Resident for the whole step: weights, plus gradients and optimizer state if training."""
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def transient_bytes(self) -> int:
        """Held only while the model-stage runs: activations, KV cache, workspace."""
        return self.activations_bytes + self.kv_cache_bytes + self.workspace_bytes

    @property
    def peak_bytes(self) -> int:
        return self.persistent_bytes + self.transient_bytes

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> MemoryBreakdown:
        values = {}
        for f in fields(MemoryBreakdown):
            v = d.get(f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"memory.{f.name}", v, "must be an integer >= 0")
            values[f.name] = v
        return MemoryBreakdown(**values)


def _layer_activation_bytes(w: Workload, s: int, b: int) -> int:
    """``s·b·h·(34 + 5·a·s/h)/t`` = ``s·b·(34·h + 5·a·s)/t`` bytes of one layer."""
    m = w.model
    return math.ceil(s * b * (34 * m.hidden_size + 5 * m.num_attention_heads * s) / w.tp)


def _rank_memory(w: Workload, st: PipelineStage, workspace: int, factor: float) -> MemoryBreakdown:
    m, t, B, b = w.model, w.tp, w.dtype_bytes, w.micro_batch
    weights = B * st.params
    grads = optimizer = activations = kv = 0
    if w.kind == "train":
        s = w.max_seq_len
        grads = B * st.params
        optimizer = ADAM_FP32_BYTES_PER_PARAM * st.params
        in_flight = min(w.pp - st.pp_rank, w.micro_batches)
        per_layer = _layer_activation_bytes(w, s, b)
        if w.recompute:
            checkpoint = math.ceil(2 * s * b * m.hidden_size / t)
            activations = checkpoint * st.num_layers * in_flight + per_layer
        else:
            activations = per_layer * st.num_layers * in_flight
        if st.last:
            activations += math.ceil(LOGIT_BYTES * b * s * w.head_outputs / t)
    elif w.kind == "forward":
        s = w.max_seq_len
        activations = _layer_activation_bytes(w, s, b)
        if st.last:
            activations += math.ceil(LOGIT_BYTES * b * s * w.head_outputs / t)
    else:  # generate
        s = w.prompt_len + w.max_gen_len
        rounds = min(w.pp, w.micro_batches)
        kv = rounds * 2 * b * s * math.ceil(m.num_kv_heads / t) * m.kv_channels * B * st.num_layers
        activations = _layer_activation_bytes(w, w.prompt_len, b)
        if st.last:
            activations += math.ceil(LOGIT_BYTES * b * w.head_outputs / t)

    def f(x: int) -> int:
        return round(x * factor)

    return MemoryBreakdown(f(weights), f(grads), f(optimizer), f(activations), f(kv), f(workspace))


def _workspace_bytes(setup: Setup) -> int:
    return CPU_WORKSPACE_BYTES if setup.cluster.gpu.vendor == "cpu" else WORKSPACE_BYTES


def _memo_key(setup: Setup, ms: ModelStage, cand: Candidate, calib: Calibration) -> tuple[object, ...]:
    """Everything a breakdown depends on: ``grad_accum`` only through ``min(pp, grad_accum)``."""
    return (
        cand.tp, cand.pp, cand.micro_batch, min(cand.pp, cand.grad_accum),
        cand.recompute and ms.trainable, _workspace_bytes(setup), calib.memory_factor(ms.name),
    )


def rank_memory(
    setup: Setup, ms: ModelStage, cand: Candidate, calib: Calibration, pp_rank: int
) -> MemoryBreakdown:
    """Bytes on one GPU of pipeline rank ``pp_rank`` (every TP rank of a stage holds the same)."""
    ctx = stage_context(setup, ms)
    check_candidate(ctx, cand)
    if not 0 <= pp_rank < cand.pp:
        raise ConfigError(f"{cand.name}.pp_rank", pp_rank, f"must be in [0, {cand.pp})")
    key = ("rank", pp_rank, *_memo_key(setup, ms, cand, calib))
    got = ctx.memo.get(key)
    if not isinstance(got, MemoryBreakdown):
        w = workload(setup, ms, cand)
        got = _rank_memory(w, w.stage(pp_rank), _workspace_bytes(setup), calib.memory_factor(ms.name))
        if len(ctx.memo) >= MEMO_MAX:
            ctx.memo.clear()
        ctx.memo[key] = got
    return got


def stage_memory(setup: Setup, ms: ModelStage, cand: Candidate, calib: Calibration) -> MemoryBreakdown:
    """Breakdown of the most loaded GPU (highest peak; ties: lowest pipeline rank).

    Within a run of ranks with the same layers, the first holds the most micro-batches in flight,
    so only the first rank of each run (``Workload.distinct_stages``) is evaluated.
    """
    ctx = stage_context(setup, ms)
    check_candidate(ctx, cand)
    key = ("peak", *_memo_key(setup, ms, cand, calib))
    got = ctx.memo.get(key)
    if isinstance(got, MemoryBreakdown):
        return got
    w = workload(setup, ms, cand)
    ws, factor = _workspace_bytes(setup), calib.memory_factor(ms.name)
    best: MemoryBreakdown | None = None
    for st, _count in w.distinct_stages():
        mb = _rank_memory(w, st, ws, factor)
        if best is None or mb.peak_bytes > best.peak_bytes:
            best = mb
    assert best is not None
    if len(ctx.memo) >= MEMO_MAX:
        ctx.memo.clear()
    ctx.memo[key] = best
    return best


def memory_capacity_bytes(setup: Setup) -> int:
    """Usable bytes per GPU: ``(1 − memory_headroom) · memory_bytes``."""
    return int((1.0 - setup.job.controller.memory_headroom) * setup.cluster.gpu.memory_bytes)


def gpu_memory(setup: Setup, plan: ExecutionPlan, calib: Calibration) -> dict[int, int]:
    """Peak bytes per GPU id of a placed plan.

    Persistent state of every model-stage with a replica on a GPU stays resident all step
    (co-resident idle model-stages). Model-stages that share a logical state (actor-gen and
    actor-train) keep it once: the largest persistent part counts, and another layout of the
    same state on that GPU (different tp, pp or shard position) adds its weights as transient, a
    resharded copy that lives only while it runs. Transient bytes: lanes may overlap, so they
    add; phases of a lane take turns (max); model-stages of a phase on the same GPU add.
    """
    workflow = setup.job.workflow
    # gpu -> list of (model-stage, breakdown, shard key)
    on_gpu: dict[int, list[tuple[ModelStage, MemoryBreakdown, tuple[int, int, int, int]]]] = {}
    for sp in plan.stages:
        try:
            ms = workflow.by_name(sp.name)
        except KeyError:
            raise ConfigError("plan.stages", sp.name, "not a model-stage of the workflow") from None
        if len(sp.replicas) != sp.dp or any(len(r) != sp.tp * sp.pp for r in sp.replicas):
            raise ConfigError(f"plan.{sp.name}.replicas", sp.replicas, "plan is not placed")
        per_rank = [rank_memory(setup, ms, sp.candidate, calib, i) for i in range(sp.pp)]
        for rep in sp.replicas:
            for pos, gpu in enumerate(rep):
                pp_rank, tp_rank = divmod(pos, sp.tp)
                key = (sp.tp, sp.pp, pp_rank, tp_rank)
                on_gpu.setdefault(gpu, []).append((ms, per_rank[pp_rank], key))
    result: dict[int, int] = {}
    for gpu in sorted(on_gpu):
        entries = on_gpu[gpu]
        persistent = 0
        transient: dict[str, int] = {}
        for state in sorted({ms.state for ms, _, _ in entries}):
            group = [e for e in entries if e[0].state == state]
            keeper = max(group, key=lambda e: (e[1].persistent_bytes, e[0].name))
            persistent += keeper[1].persistent_bytes
            for ms, mb, key in group:
                extra = mb.weights_bytes if (ms.name != keeper[0].name and key != keeper[2]) else 0
                transient[ms.name] = transient.get(ms.name, 0) + mb.transient_bytes + extra
        peak_transient = 0
        for lane in workflow.lanes:
            peak_transient += max(
                (sum(transient.get(n, 0) for n in phase) for phase in lane), default=0
            )
        result[gpu] = persistent + peak_transient
    return result
