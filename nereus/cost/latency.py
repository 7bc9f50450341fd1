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
  hides behind the backward pass (with the distributed optimizer the same bytes move as a
  reduce-scatter plus an all-gather). The Adam step streams ``24 + 2 · bytes`` bytes per
  parameter through HBM at the copy efficiency, over ``1/dp`` of the shard with the distributed
  optimizer.
- Pipeline stages hold the layers of ``nereus.spec.model.pipeline_split`` (uneven when ``pp``
  does not divide them); the first, a middle and the last stage are costed, the slowest sets
  ``max τ``.
- Generation: prefill is compute-bound over the prompt; each of the ``gen_len`` (mean) decode
  steps costs the larger of the memory time (weights of the stage + KV cache of the batch over
  HBM at decode-memory efficiency) and the compute time, plus TP all-reduces and PP sends of one
  token's hidden states (latency-dominated).
- Replicas are identical on a homogeneous cluster but for their share of the sequences: the
  slowest is one with the largest share (``micro_batch · grad_accum``), which the candidate
  describes.
- Fixed costs per event (a layer's kernels for one micro-batch, a decoded token, an update) come
  on top, as the component ``fixed`` (:mod:`nereus.cost.overhead`; 0 on GPUs until measured).
- CPU ranks playing GPUs share their host's cores: every component is stretched by
  ``ClusterSpec.contention`` (busy ranks per host over its cores); 1 on GPUs.

All of it is evaluated over arrays of candidates (``latency_arrays``); ``stage_latency`` is the
one-row case.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from nereus.cost.calibration import Calibration
from nereus.cost.overhead import STEP_EVENTS, step_event_arrays
from nereus.cost.workload import (
    MEMO_MAX,
    CandidateArrays,
    StageContext,
    check_candidate,
    split_arrays,
    stage_context,
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
        self.fixed_s = {k: calib.fixed_s(gpu, k) for k in STEP_EVENTS}  # per event

    def allreduce_s(self, nbytes: float, members: int, inter: bool) -> float:
        if members <= 1:
            return 0.0
        link = 1 if inter else 0
        return self.lat_s[link] + 2.0 * (members - 1) / members * nbytes / self.ar_bps[link]

    def send_s(self, nbytes: float, inter: bool) -> float:
        link = 1 if inter else 0
        return self.lat_s[link] + nbytes / self.p2p_bps[link]


@functools.lru_cache(maxsize=64)
def rates(gpu: GpuSpec, calib: Calibration) -> _Rates:
    """Achieved rates of ``gpu`` under ``calib`` (cached; the input of ``latency_arrays``)."""
    return _Rates(gpu, calib)


_rates = rates


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


def sum_max_linear_arrays(
    a1: np.ndarray, b1: np.ndarray, a2: np.ndarray, b2: np.ndarray, n: int
) -> np.ndarray:
    """:func:`sum_max_linear` element-wise over arrays (``n`` shared)."""

    def part(a: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        k = hi - lo
        return np.where(k > 0, k * a + b * k * (lo + hi - 1) / 2.0, 0.0)

    if n <= 0:
        return np.zeros_like(a1)
    d0, db = a1 - a2, b1 - b2
    zero = np.zeros_like(a1)
    full = np.full_like(a1, float(n))
    flat = np.where(d0 >= 0, part(a1, b1, zero, full), part(a2, b2, zero, full))
    safe_db = np.where(db == 0, 1.0, db)
    cross = np.minimum(float(n + 1), np.maximum(-1.0, -d0 / safe_db))
    k_up = np.minimum(n, np.maximum(0, np.ceil(cross)))
    up = part(a2, b2, zero, k_up) + part(a1, b1, k_up, full)
    k_down = np.minimum(n, np.maximum(0, np.floor(cross) + 1))
    down = part(a1, b1, zero, k_down) + part(a2, b2, k_down, full)
    return np.where(db == 0, flat, np.where(db > 0, up, down))


def _allreduce(r: _Rates, nbytes: np.ndarray, members: np.ndarray, inter: np.ndarray | bool
               ) -> np.ndarray:
    lat: float | np.ndarray
    bps: float | np.ndarray
    if isinstance(inter, bool):
        lat, bps = r.lat_s[int(inter)], r.ar_bps[int(inter)]
    else:
        lat = np.where(inter, r.lat_s[1], r.lat_s[0])
        bps = np.where(inter, r.ar_bps[1], r.ar_bps[0])
    safe = np.maximum(members, 1)
    t = lat + 2.0 * (safe - 1) / safe * nbytes / bps
    return np.where(members <= 1, 0.0, t)


def _send(r: _Rates, nbytes: np.ndarray, inter: bool) -> np.ndarray:
    link = 1 if inter else 0
    return r.lat_s[link] + nbytes / r.p2p_bps[link]


@dataclass(frozen=True, eq=False)
class LatencyArrays:
    """Predicted seconds per step of many candidates: ``total_s`` and its components."""

    keys: tuple[str, ...]
    components: tuple[np.ndarray, ...]
    total_s: np.ndarray

    def record(self, name: str, i: int) -> StageLatency:
        comps = tuple((k, float(v[i])) for k, v in zip(self.keys, self.components, strict=True))
        return StageLatency(name, float(self.total_s[i]), comps)


def stage_params_arrays(
    ctx: StageContext, ca: CandidateArrays
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Layers and parameters on one TP rank of the first, a middle and the last pipeline stage:
    ``(f, m, l, P_first, P_mid, P_last)`` (with ``pp == 1`` the one stage is first and last).
    Cached on ``ca``."""
    d = ctx.dims
    key = ("params", d, ctx.head_params(1), ctx.head_params(2))
    got = ca.cache.get(key)
    if got is not None:
        f, m, last, p_first, p_mid, p_last = got
        return f, m, last, p_first, p_mid, p_last
    tp, pp = ca.tp, ca.pp
    f, m, last = split_arrays(d.num_layers, pp)
    head = np.where(pp > 1, ctx.head_params(2), ctx.head_params(1))
    one = pp == 1
    p_first = f * d.layer_params + d.embedding_params + np.where(one, head, 0)
    p_mid = m * d.layer_params
    p_last = last * d.layer_params + head + np.where(one, d.embedding_params, 0)
    out = (f, m, last, -(-p_first // tp), -(-p_mid // tp), -(-p_last // tp))
    ca.cache[key] = out
    return out


def _links(ca: CandidateArrays, gpn: int) -> tuple[np.ndarray, ...]:
    """Per candidate: boundaries crossing nodes, whether the first / a middle stage's send
    crosses, and the pp > 1, pp > 2 masks. Boundary i → i+1 of a replica packed from a node
    boundary crosses nodes iff ``gpn / gcd(tp, gpn)`` divides i + 1. Cached on ``ca``."""
    key = ("links", gpn)
    got = ca.cache.get(key)
    if got is None:
        t, pp = ca.tp, ca.pp
        period = gpn // np.gcd(t, gpn)
        multi = pp > 1
        n_cross = np.where(multi, (pp - 1) // period, 0)
        first_inter = period == 1
        mid_inter = (pp - 1) // period - 1 // period > 0
        got = (n_cross, first_inter, mid_inter, multi, pp > 2, n_cross > 0)
        ca.cache[key] = got
    return got


def latency_arrays(ctx: StageContext, r: _Rates, gpn: int, ca: CandidateArrays,
                   contention: float = 1.0) -> LatencyArrays:
    """The latency model of the module docstring over arrays of candidates (one model-stage);
    ``contention``: how much slower CPU ranks sharing a host's cores run (``ClusterSpec``)."""
    d, kind = ctx.dims, ctx.kind
    h, q, mp, bts = d.hidden_size, d.q_size, d.matmul_params_per_layer, ctx.dtype_bytes
    head_mm = h * ctx.head_outputs
    t, pp, dp = ca.tp, ca.pp, ca.dp
    b = ca.micro_batch.astype(np.float64)
    micro = ca.grad_accum.astype(np.float64)
    gemm_f, attn_f = r.gemm_flops * t, r.attn_flops * t  # FLOP/s of the t GPUs of one stage
    f, m, last_l, p_first, p_mid, p_last = stage_params_arrays(ctx, ca)
    n_cross, first_inter, mid_inter, multi, deep, crosses = _links(ca, gpn)
    head_p = np.where(multi, ctx.head_params(2), ctx.head_params(1))
    no_inter = False

    if kind == "generate":
        sp, g = ctx.prompt_len, ctx.gen_len
        keys: tuple[str, ...] = ("prefill", "decode", "tp_comm", "pp_p2p")
        layer_c = 2.0 * mp * b * sp / gemm_f + 2.0 * sp * sp * q * b / attn_f
        head_c = 2.0 * head_mm * b / gemm_f
        layer_tp = 2 * (_allreduce(r, b * sp * h * bts, t, no_inter)
                        + g * _allreduce(r, b * h * bts, t, no_inter))
        kv_layer = 2 * (-(-d.num_kv_heads // t)) * d.kv_channels * bts * b
        w_layer = bts * d.layer_params / t
        w_head = bts * head_p / t
        dec_mem = 1.0 / r.decode_bps
        dec_gemm = 2.0 * mp * b / gemm_f
        dec_attn = 4.0 * q * b / attn_f
        dec_head = 2.0 * head_mm * b / gemm_f
        p2p_intra = _send(r, b * sp * h * bts, False) + g * _send(r, b * h * bts, False)
        p2p_inter = _send(r, b * sp * h * bts, True) + g * _send(r, b * h * bts, True)

        def base(n: np.ndarray, is_last: np.ndarray | bool) -> tuple[np.ndarray, ...]:
            wb = w_layer * n + np.where(is_last, w_head, 0.0)
            kv = kv_layer * n
            comp_a = dec_gemm * n + dec_attn * sp * n + np.where(is_last, dec_head, 0.0)
            decode = sum_max_linear_arrays(
                (wb + kv * sp) * dec_mem, kv * dec_mem, comp_a, dec_attn * n, g
            )
            return layer_c * n + np.where(is_last, head_c, 0.0), decode, layer_tp * n
    else:
        s_len = ctx.seq_len
        train = kind == "train"
        mult = np.where(ca.recompute, 4, 3) if train else np.ones(t.shape, dtype=np.int64)
        keys = ("compute", "tp_comm", "pp_p2p")
        layer_c = mult * (2.0 * mp * b * s_len / gemm_f + 2.0 * s_len * s_len * q * b / attn_f)
        head_c = mult * 2.0 * head_mm * b * s_len / gemm_f
        n_ar = 2 * (mult - 1) if train else 2
        layer_tp = n_ar * _allreduce(r, b * s_len * h * bts, t, no_inter)
        sends = 2 if train else 1
        p2p_intra = sends * _send(r, b * s_len * h * bts, False)
        p2p_inter = sends * _send(r, b * s_len * h * bts, True)

        def base(n: np.ndarray, is_last: np.ndarray | bool) -> tuple[np.ndarray, ...]:
            return layer_c * n + np.where(is_last, head_c, 0.0), layer_tp * n

    intra = np.where(multi, p2p_intra, 0.0)
    inter = np.where(crosses, p2p_inter, 0.0)
    one = ~multi
    # the first, a middle and the last stage in one pass: rows 0, 1, 2 of (3, n) arrays
    parts = base(np.stack([f, m, last_l]), np.stack([one, np.zeros_like(one), ~np.zeros_like(one)]))
    b_first = tuple(x[0] for x in parts)
    b_mid = tuple(x[1] for x in parts)
    b_last = tuple(x[2] for x in parts)
    send_first = np.where(one, 0.0, np.where(first_inter, inter, intra))
    send_mid = np.where(mid_inter, inter, intra)
    s_first, s_mid, s_last = sum(b_first), sum(b_mid), sum(b_last)
    tau_first = s_first + send_first
    tau_mid = np.where(deep, s_mid + send_mid, -np.inf)
    tau_last = np.where(multi, s_last, -np.inf)
    taus = np.stack([tau_first, tau_mid, tau_last])
    which = np.argmax(taus, axis=0)  # ties: the earlier stage, as the scalar model
    tau_max = np.take_along_axis(taus, which[None, :], axis=0)[0]
    sum_base = s_first + np.where(deep, (pp - 2) * s_mid, 0.0) + np.where(multi, s_last, 0.0)
    sum_tau = sum_base + n_cross * inter + (pp - 1 - n_cross) * intra
    comps: list[np.ndarray] = []
    zeros = np.zeros(t.shape)
    for j in range(len(keys) - 1):
        pick = np.choose(which, [b_first[j], b_mid[j], b_last[j]])
        comps.append(micro * pick)
    comps.append(micro * np.choose(which, [send_first, send_mid, zeros]))
    comps.append(np.where(multi, np.maximum(0.0, sum_tau - tau_max), 0.0))
    keys = (*keys, "pp_bubble")
    if kind == "train":
        shard = np.maximum(np.maximum(p_first, np.where(deep, p_mid, 0)),
                           np.where(multi, p_last, 0))
        spans = dp * t * pp > gpn
        comps.append((1.0 - DP_OVERLAP) * _allreduce(r, bts * shard, dp, spans))
        traffic = (ADAM_STATE_TRAFFIC_BYTES + 2 * bts) * shard
        if ctx.distributed_optimizer:  # each replica steps its 1/dp of the optimizer state
            traffic = (ADAM_STATE_TRAFFIC_BYTES + 2 * bts) * (-(-shard // dp))
        comps.append(traffic / r.copy_bps)
        keys = (*keys, "dp_sync", "optimizer")
    u = float(ctx.updates)
    scaled = [u * c for c in comps]
    # fixed costs per event (layer passes, decoded tokens, ...): nereus.cost.overhead
    events = step_event_arrays(ctx, ca)
    fixed = np.zeros(t.shape)
    for k, n in events.items():
        if r.fixed_s.get(k, 0.0):
            fixed = fixed + n * r.fixed_s[k]
    scaled.append(fixed)
    keys = (*keys, "fixed")
    if contention != 1.0:  # CPU ranks sharing a host's cores run that much slower
        scaled = [contention * c for c in scaled]
    total = scaled[0].copy()
    for c in scaled[1:]:
        total = total + c
    return LatencyArrays(keys, tuple(scaled), total)


def stage_latency(setup: Setup, ms: ModelStage, cand: Candidate, calib: Calibration) -> StageLatency:
    """Predicted seconds per step of ``ms`` under ``cand`` (components: see module docstring)."""
    ctx = stage_context(setup, ms)
    check_candidate(ctx, cand)
    r = _rates(setup.cluster.gpu, calib)
    key = ("latency", r, setup.cluster.gpus_per_node, setup.cluster.contention, cand)
    got = ctx.memo.get(key)
    if isinstance(got, StageLatency):
        return got
    arrays = latency_arrays(ctx, r, setup.cluster.gpus_per_node, CandidateArrays.of([cand]),
                            setup.cluster.contention)
    got = arrays.record(ms.name, 0)
    if len(ctx.memo) >= MEMO_MAX:
        ctx.memo.clear()
    ctx.memo[key] = got
    return got


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
    rates.cache_clear()
