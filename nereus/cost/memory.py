"""Per-GPU memory of a model-stage candidate and of a placed plan (llm-analysis style, §3).

Per GPU of pipeline rank ``i`` (``L_i`` layers, ``P_i`` parameters on one TP rank, see
``nereus.cost.workload``), with ``b`` = micro_batch, ``s`` = prompt + p95 generated tokens,
``h`` hidden size, ``a`` attention heads, ``t`` = tp, ``B`` = dtype bytes (bf16: 2):

- weights ``B · P_i``; training adds gradients ``B · P_i`` and Adam state ``12 · P_i`` (fp32
  master, m, v); with the distributed optimizer (``job.distributed_optimizer``, Megatron's
  ``--use-distributed-optimizer``) the Adam state is sharded over the ``dp`` replicas,
  ``12 · P_i / dp``.
- training activations: without recompute ``s·b·h·(34 + 5·a·s/h)/t`` bytes per layer (Korthikanti
  et al. with sequence parallelism and the 4h MLP of GPT); the ``5·a·s/h`` term is the
  materialized attention scores, softmax and dropout mask, which flash / memory-efficient SDPA
  kernels never store (``job.flash_attention``, the default: ``34·s·b·h/t``), times ``L_i``,
  times the micro-batches in flight on
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

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from nereus.cost.calibration import Calibration
from nereus.cost.latency import stage_params_arrays
from nereus.cost.workload import (
    MEMO_MAX,
    CandidateArrays,
    StageContext,
    check_candidate,
    stage_context,
)
from nereus.errors import ConfigError
from nereus.spec.job import Setup
from nereus.spec.model import ADAM_FP32_BYTES_PER_PARAM
from nereus.spec.plan import Candidate, ExecutionPlan
from nereus.spec.workflow import ModelStage, Workflow

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


@dataclass(frozen=True, eq=False)
class MemoryArrays:
    """Per-GPU bytes of one pipeline rank (or the most loaded) of many candidates."""

    weights: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    kv_cache: np.ndarray
    workspace: np.ndarray

    @property
    def persistent(self) -> np.ndarray:
        return self.weights + self.grads + self.optimizer

    @property
    def peak(self) -> np.ndarray:
        return self.persistent + self.activations + self.kv_cache + self.workspace

    def record(self, i: int) -> MemoryBreakdown:
        return MemoryBreakdown(
            int(self.weights[i]), int(self.grads[i]), int(self.optimizer[i]),
            int(self.activations[i]), int(self.kv_cache[i]), int(self.workspace[i]),
        )

    def where(self, mask: np.ndarray, other: MemoryArrays) -> MemoryArrays:
        """Rows of ``self`` where ``mask``, else of ``other``."""
        return MemoryArrays(*(np.where(mask, a, b) for a, b in zip(self._cols(), other._cols(), strict=True)))

    def _cols(self) -> tuple[np.ndarray, ...]:
        return (self.weights, self.grads, self.optimizer, self.activations, self.kv_cache,
                self.workspace)


def _layer_activation_bytes(ctx: StageContext, s: int, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``⌈s·b·(34·h + 5·a·s)/t⌉`` bytes of one layer; without the score term under flash."""
    per_token = 34 * ctx.dims.hidden_size
    if not ctx.flash_attention:
        per_token += 5 * ctx.dims.num_attention_heads * s
    return -(-(s * b * per_token) // t)


def _parts(ctx: StageContext, ca: CandidateArrays) -> tuple[np.ndarray, ...]:
    """Rank-independent bytes per candidate: activations of one layer (and with recompute of
    one layer's checkpoint), logits of the last stage, KV cache per layer (whole round)."""
    t, b = ca.tp, ca.micro_batch
    head_out = ctx.head_outputs
    zero = np.zeros(t.shape, dtype=np.int64)
    if ctx.kind == "train":
        s = ctx.max_seq_len
        per_layer = _layer_activation_bytes(ctx, s, b, t)
        checkpoint = -(-(2 * s * b * ctx.dims.hidden_size) // t)
        logits = -(-(LOGIT_BYTES * b * s * head_out) // t)
        return per_layer, checkpoint, logits, zero
    if ctx.kind == "forward":
        s = ctx.max_seq_len
        per_layer = _layer_activation_bytes(ctx, s, b, t)
        return per_layer, zero, -(-(LOGIT_BYTES * b * s * head_out) // t), zero
    s = ctx.prompt_len + ctx.max_gen_len
    rounds = np.minimum(ca.pp, ca.grad_accum)
    kv_heads = -(-ctx.dims.num_kv_heads // t)
    kv_layer = rounds * 2 * b * s * kv_heads * ctx.dims.kv_channels * ctx.dtype_bytes
    per_layer = _layer_activation_bytes(ctx, ctx.prompt_len, b, t)
    return per_layer, zero, -(-(LOGIT_BYTES * b * head_out) // t), kv_layer


def _rank(
    ctx: StageContext, ca: CandidateArrays, parts: tuple[np.ndarray, ...], pp_rank: np.ndarray,
    layers: np.ndarray, params: np.ndarray, last: np.ndarray | bool, workspace: int, factor: float,
) -> MemoryArrays:
    per_layer, checkpoint, logits, kv_layer = parts
    weights = ctx.dtype_bytes * params
    zero = np.zeros(params.shape, dtype=np.int64)
    grads = optimizer = kv = zero
    if ctx.kind == "train":
        grads = weights
        optimizer = ADAM_FP32_BYTES_PER_PARAM * params
        if ctx.distributed_optimizer:
            optimizer = -(-optimizer // ca.dp)
        in_flight = np.minimum(ca.pp - pp_rank, ca.grad_accum)
        held = np.where(ca.recompute, checkpoint, per_layer) * layers * in_flight
        activations = held + np.where(ca.recompute, per_layer, 0) + np.where(last, logits, 0)
    elif ctx.kind == "forward":
        activations = per_layer + np.where(last, logits, 0)
    else:  # generate
        kv = kv_layer * layers
        activations = per_layer + np.where(last, logits, 0)
    ws = np.full(params.shape, workspace, dtype=np.int64)
    cols: list[np.ndarray] = [weights, grads, optimizer, activations, kv, ws]
    if factor != 1.0:
        cols = [np.round(x * factor).astype(np.int64) for x in cols]
    return MemoryArrays(*cols)


def rank_arrays(
    ctx: StageContext, ca: CandidateArrays, pp_rank: np.ndarray, workspace: int, factor: float
) -> MemoryArrays:
    """The memory model of the module docstring for pipeline rank ``pp_rank`` of each candidate."""
    f, m, last_l, p_first, p_mid, p_last = stage_params_arrays(ctx, ca)
    first, last = pp_rank == 0, pp_rank == ca.pp - 1
    layers = np.where(first, f, np.where(last, last_l, m))
    params = np.where(first, p_first, np.where(last, p_last, p_mid))
    return _rank(ctx, ca, _parts(ctx, ca), pp_rank, layers, params, last, workspace, factor)


def stage_arrays(
    ctx: StageContext, ca: CandidateArrays, workspace: int, factor: float
) -> tuple[MemoryArrays, np.ndarray]:
    """The most loaded GPU of each candidate (highest peak; ties: lowest pipeline rank) and the
    largest persistent bytes over its pipeline ranks.

    Of the middle ranks (same layers) the first holds the most micro-batches in flight, so only
    ranks 0, 1 and ``pp − 1`` are evaluated.
    """
    pp = ca.pp
    f, m, last_l, p_first, p_mid, p_last = stage_params_arrays(ctx, ca)
    parts = _parts(ctx, ca)
    one = pp == 1
    zero = np.zeros(pp.shape, dtype=np.int64)
    r0 = _rank(ctx, ca, parts, zero, f, p_first, one, workspace, factor)
    r1 = _rank(ctx, ca, parts, zero + 1, m, p_mid, False, workspace, factor)
    rl = _rank(ctx, ca, parts, pp - 1, last_l, p_last, True, workspace, factor)
    mid, multi = pp > 2, pp > 1
    p0, p1, pl = r0.peak, r1.peak, rl.peak
    use1 = mid & (p1 > p0)
    best_peak = np.where(use1, p1, p0)
    usel = multi & (pl > best_peak)
    best = rl.where(usel, r1.where(use1, r0))
    persistent = np.maximum(np.maximum(r0.persistent, np.where(mid, r1.persistent, 0)),
                            np.where(multi, rl.persistent, 0))
    return best, persistent


def _workspace_bytes(setup: Setup) -> int:
    return CPU_WORKSPACE_BYTES if setup.cluster.gpu.vendor == "cpu" else WORKSPACE_BYTES


def rank_memory(
    setup: Setup, ms: ModelStage, cand: Candidate, calib: Calibration, pp_rank: int
) -> MemoryBreakdown:
    """Bytes on one GPU of pipeline rank ``pp_rank`` (every TP rank of a stage holds the same)."""
    ctx = stage_context(setup, ms)
    check_candidate(ctx, cand)
    if not 0 <= pp_rank < cand.pp:
        raise ConfigError(f"{cand.name}.pp_rank", pp_rank, f"must be in [0, {cand.pp})")
    factor = calib.memory_factor(ms.name)
    ws = _workspace_bytes(setup)
    key = ("ranks", cand, ws, factor)
    got = ctx.memo.get(key)
    if not isinstance(got, tuple):
        ca = CandidateArrays.of([cand] * cand.pp)
        arrays = rank_arrays(ctx, ca, np.arange(cand.pp, dtype=np.int64), ws, factor)
        got = tuple(arrays.record(i) for i in range(cand.pp))
        if len(ctx.memo) >= MEMO_MAX:
            ctx.memo.clear()
        ctx.memo[key] = got
    return got[pp_rank]


def stage_memory(setup: Setup, ms: ModelStage, cand: Candidate, calib: Calibration) -> MemoryBreakdown:
    """Breakdown of the most loaded GPU (highest peak; ties: lowest pipeline rank)."""
    ctx = stage_context(setup, ms)
    check_candidate(ctx, cand)
    factor = calib.memory_factor(ms.name)
    ws = _workspace_bytes(setup)
    key = ("peak", cand, ws, factor)
    got = ctx.memo.get(key)
    if isinstance(got, MemoryBreakdown):
        return got
    best, _ = stage_arrays(ctx, CandidateArrays.of([cand]), ws, factor)
    got = best.record(0)
    if len(ctx.memo) >= MEMO_MAX:
        ctx.memo.clear()
    ctx.memo[key] = got
    return got


def memory_capacity_bytes(setup: Setup) -> int:
    """Usable bytes per GPU: ``(1 − memory_headroom) · memory_bytes``."""
    return int((1.0 - setup.job.controller.memory_headroom) * setup.cluster.gpu.memory_bytes)


# one position of a model-stage's replicas: (model-stage, its breakdown, (tp, pp, pp_rank, tp_rank))
Entry = tuple[ModelStage, MemoryBreakdown, tuple[int, int, int, int]]


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
    entries, columns, firsts, widths = memory_entries(setup, plan, calib)
    if not columns:
        return {}
    return gpu_memory_grouped(workflow, entries, columns, firsts, widths)


Entries = tuple[list[Entry], list[np.ndarray], list[int], list[int]]


def memory_entries(setup: Setup, plan: ExecutionPlan, calib: Calibration) -> Entries:
    """One entry per (model-stage, position in a replica), and per model-stage: the GPU of every
    position of every replica, its first entry id, its positions per replica (tp·pp)."""
    workflow = setup.job.workflow
    entries: list[Entry] = []
    columns: list[np.ndarray] = []
    firsts: list[int] = []
    widths: list[int] = []
    for sp in plan.stages:
        try:
            ms = workflow.by_name(sp.name)
        except KeyError:
            raise ConfigError("plan.stages", sp.name, "not a model-stage of the workflow") from None
        width = sp.tp * sp.pp
        try:
            placed = (np.asarray(sp.replicas, dtype=np.int64) if sp.replicas
                      else np.zeros((0, width), dtype=np.int64))
        except ValueError:  # replicas of different sizes
            placed = np.zeros((0, 0), dtype=np.int64)
        if len(sp.replicas) != sp.dp or placed.shape != (sp.dp, width):
            raise ConfigError(f"plan.{sp.name}.replicas", sp.replicas, "plan is not placed")
        per_rank = [rank_memory(setup, ms, sp.candidate, calib, i) for i in range(sp.pp)]
        first = len(entries)
        for pos in range(width):
            pp_rank, tp_rank = divmod(pos, sp.tp)
            entries.append((ms, per_rank[pp_rank], (sp.tp, sp.pp, pp_rank, tp_rank)))
        columns.append(placed.reshape(-1))
        firsts.append(first)
        widths.append(width)
    return entries, columns, firsts, widths


def gpu_memory_grouped(workflow: Workflow, entries: list[Entry], columns: list[np.ndarray],
                     firsts: list[int], widths: list[int], key_limit: int = 2**62
                     ) -> dict[int, int]:
    """:func:`gpu_memory` where no GPU holds two positions of one model-stage (a valid plan):
    GPUs holding the same entries have the same peak, computed once (thousands of GPUs, a few
    distinct sets)."""
    # held[g, s]: the entry of model-stage s on GPU g, -1 where none
    used = np.concatenate(columns)
    if used.size == 0:
        return {}
    held = np.full((int(used.max()) + 1, len(columns)), -1, dtype=np.int64)
    for s_idx, (gpus, first, width) in enumerate(zip(columns, firsts, widths, strict=True)):
        if np.unique(gpus).size != gpus.size:
            return gpu_memory_each(workflow, entries, columns, firsts, widths)
        held[gpus, s_idx] = first + np.arange(gpus.size, dtype=np.int64) % width
    rows = np.flatnonzero((held >= 0).any(axis=1))
    sub = held[rows]
    base = len(entries) + 1
    if base ** len(columns) < key_limit:  # one integer per GPU's entries: a 1-d unique
        keys = (sub + 1) @ (base ** np.arange(len(columns), dtype=np.int64))
        _, first_row, inverse = np.unique(keys, return_index=True, return_inverse=True)
        sigs = sub[first_row]
    else:
        sigs, inverse = np.unique(sub, axis=0, return_inverse=True)
    peaks = np.asarray([_peak_bytes(workflow, [entries[int(e)] for e in sig if e >= 0])
                        for sig in sigs], dtype=np.int64)
    return dict(zip(rows.tolist(), peaks[inverse.reshape(-1)].tolist(), strict=True))


def gpu_memory_each(workflow: Workflow, entries: list[Entry], columns: list[np.ndarray],
                     firsts: list[int], widths: list[int]) -> dict[int, int]:
    """:func:`gpu_memory` where some GPU holds two positions of one model-stage (a plan that
    placement checks reject; every entry counts)."""
    on_gpu: dict[int, list[int]] = {}
    for gpus, first, width in zip(columns, firsts, widths, strict=True):
        for k, g in enumerate(gpus.tolist()):
            on_gpu.setdefault(g, []).append(first + k % width)
    seen: dict[tuple[int, ...], int] = {}
    result: dict[int, int] = {}
    for gpu in sorted(on_gpu):
        sig = tuple(on_gpu[gpu])
        got = seen.get(sig)
        if got is None:
            got = seen[sig] = _peak_bytes(workflow, [entries[i] for i in sig])
        result[gpu] = got
    return result


def _peak_bytes(workflow: Workflow, entries: list[Entry]) -> int:
    """Peak bytes of one GPU holding ``entries`` (see :func:`gpu_memory`)."""
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
    return persistent + peak_transient
