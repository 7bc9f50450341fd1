"""A simulator truth of its own form: shape-dependent efficiency, stragglers and noise.

The planner's latency model (``nereus.cost.latency``) prices every operation class at one
efficiency. Real kernels do not run at one efficiency: a GEMM's rate depends on its size, an
attention kernel's on sequence length and heads, a decode GEMV's bandwidth on the batch, a
collective's on the message size; replicas straggle; decode rounds run until their longest
sequence ends. This truth prices each of those by its shape, so a simulated run can show errors
of the cost model's *form*, and calibration is tested against something it cannot fit exactly.

Where its numbers come from:

- GEMM, attention, decode and copy efficiencies: the measured H200 table
  (``nereus/spec/data/h200_op_efficiency.json``: bf16 GEMMs of Llama-3.1-8B layers at TP 1–8
  and 1K–16K tokens, causal SDPA at 512–8K tokens and 8 or 32 heads, decode GEMVs at batch 1, 32,
  256, device copy). GEMM efficiency is interpolated over the FLOPs of one GEMM call per GPU
  (log scale, constant below the smallest measured GEMM), attention over ``heads · seq²`` per
  GPU, decode bandwidth (weights and KV cache streamed per token) over the batch. Other GPUs keep the H200's shape curves scaled by the ratio
  of their default efficiency to the H200's (``nereus.cost.defaults``).
- Collectives and sends: ``latency + bytes / (link · e(bytes))`` with a saturating efficiency
  ``e(m) = E_MAX · m / (m + M_HALF)``. ``E_MAX`` and ``M_HALF`` are this truth's assumptions
  (no multi-GPU measurement exists in the project), chosen only so that small messages are far
  less efficient than large ones, which the planner's constant efficiency does not model.
- Decode rounds: generated lengths are taken as normal with the job's mean and p95; a round of
  ``b`` sequences decodes until its longest one ends, the expected maximum of ``b`` draws
  (``mean + σ·√(2 ln b)``, capped at 1.25 × p95), where the planner uses the mean.
- DP gradient all-reduce: hidden behind the backward pass of the last micro-batch up to that
  pass's length (the planner hides a fixed half).
- Stragglers: each replica of a model-stage is slowed in a step with probability
  ``straggler_p`` by up to ``straggler_slowdown``; the model-stage waits for its slowest replica.
  Then log-normal noise ``noise_rel`` per model-stage and step.

Deterministic for its seed.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nereus.cost.calibration import Calibration
from nereus.cost.defaults import DEFAULT_EFFICIENCIES
from nereus.cost.h200_defaults import H200_EFFICIENCY, H200_HBM_GBPS, H200_PEAK_TFLOPS
from nereus.cost.latency import COLLECTIVE_LATENCY_S, step_latency_s
from nereus.cost.workload import VALUE_HEAD_ROLES
from nereus.spec.hardware import CONSERVATIVE_EFFICIENCY, GpuSpec, OpClass
from nereus.spec.job import Setup
from nereus.spec.model import ADAM_FP32_BYTES_PER_PARAM, ModelSpec, stage_layer_counts
from nereus.spec.plan import ExecutionPlan, StagePlan

OP_TABLE = Path(__file__).resolve().parent.parent / "spec" / "data" / "h200_op_efficiency.json"
E_MAX = 0.8  # assumed: asymptotic fraction of the link a large collective reaches
M_HALF_BYTES = 1 << 20  # assumed: message size at which a collective reaches half of E_MAX
REFERENCE_IDEAL_S = 1e-3  # ideal time of the profiler's reference operation per class


@dataclass(frozen=True)
class Curve:
    """Piecewise-linear ``y(log x)``, constant beyond both ends."""

    log_x: tuple[float, ...]
    y: tuple[float, ...]

    def __call__(self, x: float) -> float:
        return float(np.interp(math.log(max(x, 1e-30)), self.log_x, self.y))

    @staticmethod
    def of(points: list[tuple[float, float]]) -> Curve:
        """Curve through the points, the y of points with equal x averaged, sorted by x."""
        by_x: dict[float, list[float]] = {}
        for x, y in points:
            by_x.setdefault(x, []).append(y)
        xs = sorted(by_x)
        return Curve(tuple(math.log(x) for x in xs), tuple(float(np.mean(by_x[x])) for x in xs))


@dataclass(frozen=True)
class OpCurves:
    """Efficiency (fraction of peak) of one H200 by operation shape."""

    gemm_fwd: Curve  # by FLOPs of one GEMM call
    gemm_bwd: Curve
    attn_fwd: Curve  # by heads · seq² of one sequence on one GPU
    attn_fwd_bwd: Curve
    decode_bw: Curve  # fraction of HBM bandwidth by decode batch
    copy_bw: float


@functools.lru_cache(maxsize=4)
def load_curves(path: str = str(OP_TABLE)) -> OpCurves:
    """The shape curves of the measured H200 op table."""
    d = json.loads(Path(path).read_text())
    peak = H200_PEAK_TFLOPS
    fwd: list[tuple[float, float]] = []
    bwd: list[tuple[float, float]] = []
    for r in d["gemm"]:
        flops = 2.0 * r["tokens"] * r["K"] * r["N"]
        fwd.append((flops, r["fwd_tflops"] / peak))
        bwd.append((flops, r["bwd_tflops"] / peak))
    attn_f = [(r["heads"] * r["seq"] ** 2, r["fwd_tflops"] / peak) for r in d["attention"]]
    attn_fb = [(r["heads"] * r["seq"] ** 2, r["fwd_bwd_tflops"] / peak) for r in d["attention"]]
    dec = [(r["batch"], r["weight_GBps"] / H200_HBM_GBPS) for r in d["decode_gemv"]]
    return OpCurves(
        Curve.of(fwd), Curve.of(bwd), Curve.of(attn_f), Curve.of(attn_fb), Curve.of(dec),
        d["bandwidth"]["d2d_copy_GBps"] / H200_HBM_GBPS,
    )


def _scale(gpu: GpuSpec, op: str) -> float:
    """Ratio of ``gpu``'s default efficiency of ``op`` to the H200's (1 for the H200)."""
    own = DEFAULT_EFFICIENCIES.get(gpu.name, {}).get(op, CONSERVATIVE_EFFICIENCY)
    return own / H200_EFFICIENCY[op]


@dataclass(frozen=True)
class _Gpu:
    """Shape-dependent rates of one GPU."""

    gpu: GpuSpec
    curves: OpCurves

    def gemm_s(self, tokens: float, k: float, n: float, backward: bool) -> float:
        flops = 2.0 * tokens * k * n
        if flops <= 0:
            return 0.0
        curve = self.curves.gemm_bwd if backward else self.curves.gemm_fwd
        eff = min(0.95, curve(flops) * _scale(self.gpu, "gemm"))
        return (2.0 if backward else 1.0) * flops / (self.gpu.peak_flops * eff)

    def attention_s(self, b: float, heads: float, seq: float, q_dim: float, backward: bool) -> float:
        flops = 2.0 * b * seq * seq * q_dim  # causal: half of 4·s²·q per layer and sequence
        curve = self.curves.attn_fwd_bwd if backward else self.curves.attn_fwd
        eff = min(0.95, curve(heads * seq * seq) * _scale(self.gpu, "attention"))
        return (3.0 if backward else 1.0) * flops / (self.gpu.peak_flops * eff)

    def decode_attention_s(self, b: float, heads: float, ctx: float, q_dim: float) -> float:
        """One new token attending to ``ctx`` cached ones (``4·q·ctx`` FLOPs per sequence): the
        attention curve at its small end (work ``heads · ctx``)."""
        eff = min(0.95, self.curves.attn_fwd(heads * ctx) * _scale(self.gpu, "attention"))
        return 4.0 * q_dim * ctx * b / (self.gpu.peak_flops * eff)

    def hbm_s(self, nbytes: float, batch: float) -> float:
        eff = min(0.95, self.curves.decode_bw(max(batch, 1.0)) * _scale(self.gpu, "decode-memory"))
        return nbytes / (self.gpu.hbm_gbps * 1e9 * eff)

    def copy_s(self, nbytes: float) -> float:
        eff = min(0.95, self.curves.copy_bw * _scale(self.gpu, "copy"))
        return nbytes / (self.gpu.hbm_gbps * 1e9 * eff)

    def link_s(self, nbytes: float, inter: bool, collective: bool, members: int = 2) -> float:
        if nbytes <= 0 or members <= 1:
            return 0.0
        lat = COLLECTIVE_LATENCY_S.get(self.gpu.vendor, (20e-6, 40e-6))[1 if inter else 0]
        bw = (self.gpu.inter_node_gbps if inter else self.gpu.intra_node_gbps) * 1e9
        moved = 2.0 * (members - 1) / members * nbytes if collective else nbytes
        eff = E_MAX * nbytes / (nbytes + M_HALF_BYTES)
        return lat + moved / (bw * eff)


def _expected_longest(mean: float, p95: float, b: int) -> float:
    """Expected longest of ``b`` normal lengths with this mean and p95 (capped at 1.25·p95)."""
    sigma = max(0.0, p95 - mean) / 1.645
    if b <= 1 or sigma == 0:
        return mean
    return min(1.25 * p95, mean + sigma * math.sqrt(2.0 * math.log(b)))


def _layer_dims(m: ModelSpec, t: int) -> tuple[tuple[float, float], ...]:
    """(K, N) of the four GEMMs of one layer on one of ``t`` TP ranks."""
    h, q, kv, f = m.hidden_size, m.q_size, m.kv_size, m.ffn_hidden_size
    up = (2 if m.gated_mlp else 1) * f
    return ((h, (q + 2 * kv) / t), (q / t, h), (h, up / t), (f / t, h))


@dataclass(frozen=True)
class ShapeTruth:
    """True step times of placed plans (see the module docstring)."""

    noise_rel: float = 0.02
    straggler_p: float = 0.02
    straggler_slowdown: float = 0.3
    seed: int = 0
    curves: OpCurves | None = None

    def _rates(self, gpu: GpuSpec) -> _Gpu:
        return _Gpu(gpu, self.curves or load_curves())

    def _rng(self, *salt: int) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64([self.seed, *salt]))

    def base_stage_s(self, setup: Setup, sp: StagePlan) -> float:
        """Seconds of one replica of ``sp`` per step, before stragglers and noise."""
        job = setup.job
        ms = job.workflow.by_name(sp.name)
        model = job.model(ms.role)
        g = self._rates(setup.cluster.gpu)
        gpn = setup.cluster.gpus_per_node
        t, pp, b, a = sp.tp, sp.pp, sp.micro_batch, sp.grad_accum
        bts = job.dtype_bytes
        h = model.hidden_size
        head_out = 1 if ms.role in VALUE_HEAD_ROLES else model.vocab_size
        layers = stage_layer_counts(model.num_layers, pp)
        dims = _layer_dims(model, t)
        heads_gpu = max(1.0, model.num_attention_heads / t)
        q_gpu = model.q_size / t
        period = gpn // math.gcd(t, gpn)

        def send(i: int, nbytes: float) -> float:
            return g.link_s(nbytes, (i + 1) % period == 0, collective=False) if i < pp - 1 else 0.0

        taus: list[float] = []
        bwd_last = 0.0
        if ms.kind == "generate":
            sp_len, mean, p95 = job.prompt_len, job.gen_len, job.gen_len_p95 or job.gen_len
            steps = _expected_longest(mean, p95, b)
            kv_tok = 2 * math.ceil(model.num_kv_heads / t) * model.kv_channels * bts * b
            for i, n in enumerate(layers):
                last = i == pp - 1
                pre = n * sum(g.gemm_s(b * sp_len, k, nn, False) for k, nn in dims)
                pre += n * g.attention_s(b, heads_gpu, sp_len, q_gpu, False)
                pre += 2 * n * g.link_s(b * sp_len * h * bts, False, True, t)
                w_bytes = bts * n * model.layer_params() / t
                if last:
                    w_bytes += bts * h * head_out / t
                    pre += g.gemm_s(b, h, head_out / t, False)
                # decode: weights + the KV cache so far, or the GEMMs at batch b, per token
                mid_ctx = sp_len + steps / 2.0
                mem = g.hbm_s(w_bytes + kv_tok * n * mid_ctx, b)
                comp = n * sum(g.gemm_s(b, k, nn, False) for k, nn in dims)
                comp += n * g.decode_attention_s(b, heads_gpu, mid_ctx, q_gpu)
                tp_tok = 2 * n * g.link_s(b * h * bts, False, True, t)
                dec = steps * (max(mem, comp) + tp_tok + send(i, b * h * bts))
                taus.append(pre + dec + send(i, b * sp_len * h * bts))
        else:
            s_len = job.seq_len
            train = ms.kind == "train"
            rc = train and sp.recompute
            for i, n in enumerate(layers):
                last = i == pp - 1
                fwd = n * sum(g.gemm_s(b * s_len, k, nn, False) for k, nn in dims)
                fwd += n * g.attention_s(b, heads_gpu, s_len, q_gpu, False)
                if last:
                    fwd += g.gemm_s(b * s_len, h, head_out / t, False)
                n_ar = 2
                tau = fwd
                if train:
                    bwd = n * sum(g.gemm_s(b * s_len, k, nn, True) for k, nn in dims)
                    bwd += n * g.attention_s(b, heads_gpu, s_len, q_gpu, True)
                    if last:
                        bwd += g.gemm_s(b * s_len, h, head_out / t, True)
                    tau = fwd + bwd + (fwd if rc else 0.0)
                    n_ar = 6 if rc else 4
                    bwd_last = max(bwd_last, bwd)
                tau += n_ar * n * g.link_s(b * s_len * h * bts, False, True, t)
                tau += (2 if train else 1) * send(i, b * s_len * h * bts)
                taus.append(tau)
        total = (a - 1) * max(taus) + sum(taus)
        if ms.kind == "train":
            params = max(
                (n * model.layer_params() + (model.embedding_params() if i == 0 else 0)
                 + (h * head_out if i == pp - 1 else 0)) / t
                for i, n in enumerate(layers)
            )
            spans = sp.dp * t * pp > gpn
            ar = g.link_s(bts * params, spans, True, sp.dp)
            total += max(0.0, ar - bwd_last)  # hidden behind the last backward pass
            opt = params / (sp.dp if job.distributed_optimizer else 1)
            total += g.copy_s((ADAM_FP32_BYTES_PER_PARAM * 2 + 2 * bts) * opt)
            total *= job.minibatches
        return total

    def stage_times_s(self, setup: Setup, plan: ExecutionPlan, step: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for i, sp in enumerate(plan.stages):
            base = self.base_stage_s(setup, sp)
            rng = self._rng(step, 1000 + i)
            slow = rng.random(sp.dp) < self.straggler_p
            factor = 1.0 + (self.straggler_slowdown * float(rng.random()) if slow.any() else 0.0)
            noise = float(np.exp(rng.normal(0.0, self.noise_rel))) if self.noise_rel > 0 else 1.0
            out[sp.name] = base * factor * noise
        return out

    def step_s(self, setup: Setup, plan: ExecutionPlan, step: int) -> tuple[float, dict[str, float]]:
        times = self.stage_times_s(setup, plan, step)
        return step_latency_s(setup.job.workflow, times), times

    def efficiency(self, gpu: GpuSpec, op: OpClass) -> float:
        """The efficiency a profiler measures for this class's reference operation (a Llama-8B
        sized GEMM of 4K tokens, 32-head attention at 4K tokens, batch-32 decode, 64 MiB
        collectives)."""
        g = self._rates(gpu)
        c = g.curves
        v = OpClass(op).value
        if v == "gemm":
            return min(0.95, c.gemm_fwd(2.0 * 4096 * 4096 * 14336) * _scale(gpu, "gemm"))
        if v == "attention":
            return min(0.95, c.attn_fwd(32 * 4096**2) * _scale(gpu, "attention"))
        if v == "decode-memory":
            return min(0.95, c.decode_bw(32) * _scale(gpu, "decode-memory"))
        if v == "copy":
            return min(0.95, c.copy_bw * _scale(gpu, "copy"))
        m = 64 << 20
        return E_MAX * m / (m + M_HALF_BYTES)

    def oracle_calibration(self, gpu: GpuSpec) -> Calibration:
        """The profiler's efficiencies as a calibration store (the oracle policy's view)."""
        return Calibration(tuple(sorted((gpu.name, op.value, self.efficiency(gpu, op))
                                        for op in OpClass)))

    def op_samples(self, gpu: GpuSpec, step: int) -> tuple[tuple[OpClass, float, float], ...]:
        """(op class, ideal_s, measured_s) of one profiled reference operation per class."""
        rng = self._rng(step, 7)
        out = []
        for op in OpClass:
            noise = float(np.exp(rng.normal(0.0, self.noise_rel))) if self.noise_rel > 0 else 1.0
            out.append((op, REFERENCE_IDEAL_S, REFERENCE_IDEAL_S / self.efficiency(gpu, op) * noise))
        return tuple(out)

    def transition_s(self, predicted_s: float, step: int) -> float:
        noise = float(np.exp(self._rng(step, 99).normal(0.0, self.noise_rel))) if self.noise_rel else 1.0
        return predicted_s * noise
