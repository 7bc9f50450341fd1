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
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from nereus.cost.calibration import Calibration
from nereus.cost.workload import PipelineStage, Workload, workload
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


def _sum_max_linear(a1: float, b1: float, a2: float, b2: float, n: int) -> float:
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


def _crosses(w: Workload, gpus_per_node: int, first_rank: int, count: int) -> bool:
    """True when some rank in ``[first_rank, first_rank + count)`` sends across a node boundary."""
    period = gpus_per_node // math.gcd(w.tp, gpus_per_node)  # boundary i→i+1 crosses iff period | i+1
    hi = min(first_rank + count, w.pp - 1)  # the last stage sends nothing forward
    return hi // period - first_rank // period > 0


def _p2p_s(w: Workload, r: _Rates, inter: bool) -> float:
    """Sends of one pipeline boundary per micro-batch (train: fwd + bwd) or round (generate)."""
    b, h, bts = w.micro_batch, w.model.hidden_size, w.dtype_bytes
    if w.kind == "generate":
        return r.send_s(b * w.prompt_len * h * bts, inter) + w.gen_len * r.send_s(b * h * bts, inter)
    sends = 2 if w.kind == "train" else 1
    return sends * r.send_s(b * w.seq_len * h * bts, inter)


def _stage_time(w: Workload, st: PipelineStage, r: _Rates, inter_p2p: bool) -> dict[str, float]:
    """Components of τ for one micro-batch (train/forward) or one round (generate) on ``st``."""
    m, t, bts, b = w.model, w.tp, w.dtype_bytes, w.micro_batch
    h, q, mp, L = m.hidden_size, m.q_size, w.matmul_params_per_layer, st.num_layers
    head_mm = h * w.head_outputs if st.last else 0
    out: dict[str, float] = {}
    if w.kind in ("train", "forward"):
        s = w.seq_len
        mult = 1 if w.kind == "forward" else (4 if w.recompute else 3)
        gemm = 2.0 * (L * mp + head_mm) * b * s
        attn = 2.0 * s * s * q * L * b
        out["compute"] = mult * (gemm / r.gemm_flops + attn / r.attn_flops) / t
        n_ar = 2 * (mult - 1) if w.kind == "train" else 2  # fwd 2, bwd 2, recompute 2
        out["tp_comm"] = n_ar * L * r.allreduce_s(b * s * h * bts, t, False)
        out["pp_p2p"] = 0.0 if st.last else _p2p_s(w, r, inter_p2p)
        return out
    # generation: prefill over the prompt, then gen_len decode steps
    sp, g = w.prompt_len, w.gen_len
    gemm = 2.0 * L * mp * b * sp + 2.0 * head_mm * b
    attn = 2.0 * sp * sp * q * L * b
    out["prefill"] = (gemm / r.gemm_flops + attn / r.attn_flops) / t
    weight_bytes = bts * (L * m.layer_params() + (w.head_params if st.last else 0)) / t
    kv_per_token = 2 * math.ceil(m.num_kv_heads / t) * m.kv_channels * bts * L * b
    mem_a = (weight_bytes + kv_per_token * sp) / r.decode_bps
    mem_b = kv_per_token / r.decode_bps
    comp_a = (2.0 * (L * mp + head_mm) * b / r.gemm_flops + 4.0 * sp * q * L * b / r.attn_flops) / t
    comp_b = 4.0 * q * L * b / r.attn_flops / t
    out["decode"] = _sum_max_linear(mem_a, mem_b, comp_a, comp_b, g)
    tp_prefill = 2 * L * r.allreduce_s(b * sp * h * bts, t, False)
    tp_decode = g * 2 * L * r.allreduce_s(b * h * bts, t, False)
    out["tp_comm"] = tp_prefill + tp_decode
    out["pp_p2p"] = 0.0 if st.last else _p2p_s(w, r, inter_p2p)
    return out


def stage_latency(setup: Setup, ms: ModelStage, cand: Candidate, calib: Calibration) -> StageLatency:
    """Predicted seconds per step of ``ms`` under ``cand`` (components: see module docstring)."""
    w = workload(setup, ms, cand)
    gpu, gpn = setup.cluster.gpu, setup.cluster.gpus_per_node
    r = _rates(gpu, calib)
    groups = w.distinct_stages()
    taus: list[tuple[dict[str, float], int]] = []
    for st, count in groups:
        comps = _stage_time(w, st, r, _crosses(w, gpn, st.pp_rank, count))
        taus.append((comps, count))
    if w.pp > 1:
        # Σ τ must count each crossing boundary once at inter-node cost and the others intra.
        period = gpn // math.gcd(w.tp, gpn)
        n_cross = (w.pp - 1) // period
        total_sum = 0.0
        for comps, count in taus:
            base = sum(v for k, v in comps.items() if k != "pp_p2p")
            total_sum += base * count
        p2p_intra = _p2p_s(w, r, False)
        p2p_inter = _p2p_s(w, r, True) if n_cross else 0.0
        total_sum += n_cross * p2p_inter + (w.pp - 1 - n_cross) * p2p_intra
    else:
        total_sum = sum(taus[0][0].values())
    slowest = max((c for c, _ in taus), key=lambda c: sum(c.values()))
    tau_max = sum(slowest.values())
    m = w.micro_batches
    per_update: dict[str, float] = {k: m * v for k, v in slowest.items()}
    per_update["pp_bubble"] = max(0.0, total_sum - tau_max)
    if w.kind == "train":
        shard_params = max(st.params for st, _ in groups)
        spans = w.dp * w.tp * w.pp > gpn
        ar = r.allreduce_s(w.dtype_bytes * shard_params, w.dp, spans)
        per_update["dp_sync"] = (1.0 - DP_OVERLAP) * ar
        traffic = (ADAM_STATE_TRAFFIC_BYTES + 2 * w.dtype_bytes) * shard_params
        per_update["optimizer"] = traffic / r.copy_bps
    scaled = tuple((k, w.updates * v) for k, v in per_update.items())
    return StageLatency(ms.name, sum(v for _, v in scaled), scaled)


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
