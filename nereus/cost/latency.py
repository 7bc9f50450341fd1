"""Latency of a model-stage candidate and the critical path of a step (DESIGN.md §3).

Per replica (``tp * pp`` GPUs) and per pipeline stage ``i``, one micro-batch (training,
inference) or one round of ``micro_batch`` concurrently decoded sequences (generation) takes
``τ_i = compute + TP collectives + PP point-to-point``; ``m`` micro-batches or rounds take
``(m − 1) · max τ + Σ τ`` (for generation this is an upper bound of token-interleaved pipelining).
Assumptions, stated once:

- Compute: GEMMs do ``2 · params`` FLOPs per token forward, attention ``2 · s² · q_size`` per
  sequence and layer (causal: half of ``4 · s² · q_size``); training does 3× the forward (fwd +
  bwd), 4× with full recomputation. Each class runs at ``peak · efficiency[class]``, split over tp.
- TP (always inside a node): 2 ring all-reduces per layer forward, 4 fwd + bwd, 6 with recompute,
  each sending ``2 · (t − 1)/t · b · s · h · bytes`` over the intra-node link, plus a fixed latency.
- PP: ``b · s · h · bytes`` per boundary and direction; a replica is packed on consecutive GPUs,
  so boundary ``i → i+1`` crosses nodes when GPU ``(i + 1) · tp`` of the replica starts a node.
- DP: ring all-reduce of the gradient shard, ``2 (d − 1)/d · bytes · params/(t·p)``, over the
  inter-node link when the ``dp · tp · pp`` GPUs span nodes, else intra-node; ``DP_OVERLAP`` of it
  hides behind the backward pass. The Adam step streams ``24 + 2 · bytes`` bytes per parameter
  through HBM at the copy efficiency.
- Generation: prefill is compute-bound over the prompt; each of the ``gen_len`` (mean) decode
  steps costs the larger of the memory time (weights of the stage + KV cache of the batch over
  HBM at decode-memory efficiency) and the compute time, plus TP all-reduces and PP sends of one
  token's hidden states (latency-dominated).
- All replicas are identical on a homogeneous cluster, so the slowest replica is any replica.
- Fixed costs per event (a layer's kernels for one micro-batch, a decoded token, an update) come
  on top, as the component ``fixed`` (:mod:`nereus.cost.overhead`; 0 on GPUs until measured).
- CPU ranks playing GPUs share their host's cores: every component is stretched by
  ``ClusterSpec.contention`` (busy ranks per host over its cores); 1 on GPUs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nereus.cost.calibration import Calibration
from nereus.cost.overhead import fixed_time_s, step_event_counts
from nereus.cost.workload import (
    MEMO_MAX,
    StageContext,
    check_candidate,
    stage_context,
    stage_groups,
)
from nereus.errors import ConfigError
from nereus.spec.hardware import GpuSpec, OpClass
from nereus.spec.job import Setup
from nereus.spec.plan import Candidate
from nereus.spec.workflow import ModelStage, Workflow

# Fraction of the DP gradient all-reduce hidden behind the backward pass (bucketed overlap).
DP_OVERLAP = 0.5
# Fixed cost of one collective or send, by vendor: (intra-node, inter-node) seconds. Assumed
# typical small-message latencies (NCCL/RCCL ~10/25 µs; gloo over loopback TCP ~50/100 µs).
COLLECTIVE_LATENCY_S: dict[str, tuple[float, float]] = {
    "nvidia": (10e-6, 25e-6),
    "amd": (15e-6, 30e-6),
    "cpu": (50e-6, 100e-6),
}
# Adam step HBM traffic per parameter beyond 2 × dtype (weight write, grad read): fp32 master,
# m and v, each read and written.
ADAM_STATE_TRAFFIC_BYTES = 24


@dataclass(frozen=True)
class StageLatency:
    """Predicted time of one model-stage per step, with components that add up to ``total_s``."""

    name: str
    total_s: float
    components: tuple[tuple[str, float], ...]

    def component(self, key: str) -> float:
        return sum(v for k, v in self.components if k == key)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "total_s": self.total_s, "components": dict(self.components)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> StageLatency:
        comps = d.get("components", {})
        if not isinstance(comps, Mapping):
            raise ConfigError("stage_latency.components", comps, "must be a mapping name -> seconds")
        try:
            return StageLatency(
                str(d["name"]), float(d["total_s"]), tuple((str(k), float(v)) for k, v in comps.items())
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError("stage_latency", d, f"malformed record ({e})") from None


class _Rates:
    """Achieved rates of one GPU under a calibration (bytes/s, FLOP/s, seconds)."""

    def __init__(self, gpu: GpuSpec, calib: Calibration) -> None:
        e = calib.efficiency
        self.gemm_flops = gpu.peak_flops * e(gpu, OpClass.GEMM)
        self.attn_flops = gpu.peak_flops * e(gpu, OpClass.ATTENTION)
        self.decode_bps = gpu.hbm_gbps * 1e9 * e(gpu, OpClass.DECODE_MEMORY)
        self.copy_bps = gpu.hbm_gbps * 1e9 * e(gpu, OpClass.COPY)
        intra, inter = gpu.intra_node_gbps * 1e9, gpu.inter_node_gbps * 1e9
        self.ar_bps = (intra * e(gpu, OpClass.ALLREDUCE_INTRA), inter * e(gpu, OpClass.ALLREDUCE_INTER))
        self.p2p_bps = (intra * e(gpu, OpClass.P2P_INTRA), inter * e(gpu, OpClass.P2P_INTER))
        self.lat_s = COLLECTIVE_LATENCY_S.get(gpu.vendor, (20e-6, 40e-6))

    def allreduce_s(self, nbytes: float, members: int, inter: bool) -> float:
        if members <= 1:
            return 0.0
        link = 1 if inter else 0
        return self.lat_s[link] + 2.0 * (members - 1) / members * nbytes / self.ar_bps[link]

    def send_s(self, nbytes: float, inter: bool) -> float:
        link = 1 if inter else 0
        return self.lat_s[link] + nbytes / self.p2p_bps[link]


@functools.lru_cache(maxsize=64)
def _rates(gpu: GpuSpec, calib: Calibration) -> _Rates:
    return _Rates(gpu, calib)


def sum_max_linear(a1: float, b1: float, a2: float, b2: float, n: int) -> float:
    """``Σ_{j=0}^{n-1} max(a1 + b1·j, a2 + b2·j)`` in closed form."""

    def part(a: float, b: float, lo: int, hi: int) -> float:
        k = hi - lo
        return k * a + b * k * (lo + hi - 1) / 2.0 if k > 0 else 0.0

    if n <= 0:
        return 0.0
    d0, db = a1 - a2, b1 - b2
    if db == 0:
        return part(a1, b1, 0, n) if d0 >= 0 else part(a2, b2, 0, n)
    cross = min(float(n + 1), max(-1.0, -d0 / db))  # clamped: ±inf for a tiny slope
    if db > 0:  # line 1 wins from ceil(cross) on
        k = min(n, max(0, math.ceil(cross)))
        return part(a2, b2, 0, k) + part(a1, b1, k, n)
    k = min(n, max(0, math.floor(cross) + 1))  # line 1 wins up to floor(cross)
    return part(a1, b1, 0, k) + part(a2, b2, k, n)


def _crossing_period(tp: int, gpus_per_node: int) -> int:
    """Boundary ``i → i+1`` of a packed replica crosses nodes iff this divides ``i + 1``."""
    return gpus_per_node // math.gcd(tp, gpus_per_node)


@dataclass(frozen=True)
class _Profile:
    """Pipeline timing of one (tp, pp, micro_batch, recompute) layout: everything but m and dp."""

    keys: tuple[str, ...]
    slowest: tuple[float, ...]  # components of the slowest stage's τ
    tau_max: float
    sum_tau: float
    shard_params: int  # parameters on the most loaded GPU (training: gradient all-reduce size)


def _profile(
    ctx: StageContext, r: _Rates, gpn: int, t: int, pp: int, b: int, recompute: bool
) -> _Profile:
    d, kind = ctx.dims, ctx.kind
    h, q, mp, bts = d.hidden_size, d.q_size, d.matmul_params_per_layer, ctx.dtype_bytes
    head_mm = h * ctx.head_outputs
    gemm_f, attn_f = r.gemm_flops * t, r.attn_flops * t  # FLOP/s of the t GPUs of one stage

    # Costs per layer and of the head for one micro-batch (train/forward) or round (generate).
    if kind == "generate":
        sp, g = ctx.prompt_len, ctx.gen_len
        keys: tuple[str, ...] = ("prefill", "decode", "tp_comm", "pp_p2p")
        layer_c = 2.0 * mp * b * sp / gemm_f + 2.0 * sp * sp * q * b / attn_f
        head_c = 2.0 * head_mm * b / gemm_f
        layer_tp = 2 * (r.allreduce_s(b * sp * h * bts, t, False) + g * r.allreduce_s(b * h * bts, t, False))
        kv_layer = 2 * -(-d.num_kv_heads // t) * d.kv_channels * bts * b  # bytes per token and layer
        w_layer = bts * d.layer_params / t
        w_head = bts * ctx.head_params(pp) / t
        dec_mem = 1.0 / r.decode_bps
        dec_gemm = 2.0 * mp * b / gemm_f
        dec_attn = 4.0 * q * b / attn_f
        dec_head = 2.0 * head_mm * b / gemm_f

        def p2p(inter: bool) -> float:
            return r.send_s(b * sp * h * bts, inter) + g * r.send_s(b * h * bts, inter)
    else:
        s_len = ctx.seq_len
        mult = 1 if kind == "forward" else (4 if recompute else 3)
        keys = ("compute", "tp_comm", "pp_p2p")
        layer_c = mult * (2.0 * mp * b * s_len / gemm_f + 2.0 * s_len * s_len * q * b / attn_f)
        head_c = mult * 2.0 * head_mm * b * s_len / gemm_f
        n_ar = 2 * (mult - 1) if kind == "train" else 2  # fwd 2, bwd 2, recompute 2
        layer_tp = n_ar * r.allreduce_s(b * s_len * h * bts, t, False)
        sends = 2 if kind == "train" else 1

        def p2p(inter: bool) -> float:
            return sends * r.send_s(b * s_len * h * bts, inter)

    groups = stage_groups(d.num_layers, pp)
    period = _crossing_period(t, gpn)
    p2p_intra = p2p(False) if pp > 1 else 0.0
    n_cross = (pp - 1) // period if pp > 1 else 0
    p2p_inter = p2p(True) if n_cross else 0.0
    slowest: tuple[float, ...] = ()
    tau_max = -1.0
    sum_base = 0.0
    shard = 0
    for first_rank, layers, count in groups:
        first, last = first_rank == 0, first_rank == pp - 1
        params = layers * d.layer_params + (d.embedding_params if first else 0)
        shard = max(shard, -(-(params + (ctx.head_params(pp) if last else 0)) // t))
        if kind == "generate":
            wb = w_layer * layers + (w_head if last else 0.0)
            kv = kv_layer * layers
            comp_a = dec_gemm * layers + dec_attn * sp * layers + (dec_head if last else 0.0)
            decode = sum_max_linear(
                (wb + kv * sp) * dec_mem, kv * dec_mem, comp_a, dec_attn * layers, g
            )
            base: tuple[float, ...] = (
                layer_c * layers + (head_c if last else 0.0), decode, layer_tp * layers
            )
        else:
            base = (layer_c * layers + (head_c if last else 0.0), layer_tp * layers)
        if last:
            send = 0.0
        else:  # inter-node if some rank of the group sends across a node boundary
            hi = min(first_rank + count, pp - 1)
            send = p2p_inter if hi // period - first_rank // period > 0 else p2p_intra
        tau = sum(base) + send
        sum_base += sum(base) * count
        if tau > tau_max:
            tau_max, slowest = tau, (*base, send)
    sum_tau = sum_base + n_cross * p2p_inter + (pp - 1 - n_cross) * p2p_intra
    return _Profile(keys, slowest, tau_max, sum_tau, shard)


def stage_latency(setup: Setup, ms: ModelStage, cand: Candidate, calib: Calibration) -> StageLatency:
    """Predicted seconds per step of ``ms`` under ``cand`` (components: see module docstring)."""
    ctx = stage_context(setup, ms)
    check_candidate(ctx, cand)
    r = _rates(setup.cluster.gpu, calib)
    gpn = setup.cluster.gpus_per_node
    t, pp, dp, b, m = cand.tp, cand.pp, cand.dp, cand.micro_batch, cand.grad_accum
    recompute = cand.recompute and ctx.trainable
    key = (r, gpn, t, pp, b, recompute)
    prof = ctx.memo.get(key)
    if not isinstance(prof, _Profile):
        prof = _profile(ctx, r, gpn, t, pp, b, recompute)
        if len(ctx.memo) >= MEMO_MAX:
            ctx.memo.clear()
        ctx.memo[key] = prof
    comps = [(k, m * v) for k, v in zip(prof.keys, prof.slowest, strict=True)]
    comps.append(("pp_bubble", max(0.0, prof.sum_tau - prof.tau_max) if pp > 1 else 0.0))
    if ctx.kind == "train":
        bts = ctx.dtype_bytes
        spans = dp * t * pp > gpn
        comps.append(("dp_sync", (1.0 - DP_OVERLAP) * r.allreduce_s(bts * prof.shard_params, dp, spans)))
        traffic = (ADAM_STATE_TRAFFIC_BYTES + 2 * bts) * prof.shard_params
        comps.append(("optimizer", traffic / r.copy_bps))
    u = ctx.updates
    scaled = [(k, u * v) for k, v in comps]
    # fixed costs per event (layer passes, decoded tokens, ...): nereus.cost.overhead
    scaled.append(("fixed", fixed_time_s(step_event_counts(ctx, cand), setup.cluster.gpu, calib)))
    c = setup.cluster.contention  # CPU ranks sharing a host's cores run that much slower
    if c != 1.0:
        scaled = [(k, c * v) for k, v in scaled]
    return StageLatency(ms.name, sum(v for _, v in scaled), tuple(scaled))


def step_latency_s(workflow: Workflow, stage_s: Mapping[str, float]) -> float:
    """Critical path of one step: lanes run concurrently (max), phases of a lane one after another
    (sum), model-stages of a phase concurrently (max)."""
    lanes = []
    for lane in workflow.lanes:
        total = 0.0
        for phase in lane:
            times = []
            for name in phase:
                if name not in stage_s:
                    raise ConfigError("stage_s", name, "no latency for this model-stage")
                times.append(float(stage_s[name]))
            total += max(times, default=0.0)
        lanes.append(total)
    return max(lanes, default=0.0)


def clear_caches() -> None:
    """Forget the memoized rates and stage contexts (tests of cold-cache behaviour)."""
    from nereus.cost import workload

    workload.clear_caches()
    _rates.cache_clear()
