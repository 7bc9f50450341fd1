"""What one replica of a model-stage candidate holds and processes: pipeline stages and batches.

Assumptions shared by the latency and memory models:

- The model of a model-stage is ``job.model(ms.role)``. Critic and reward models use the same
  trunk with a scalar value head (one output instead of ``vocab_size``; its size is negligible).
- Layers are split over ``pp`` stages as Megatron does (``nereus.spec.model.pipeline_split``):
  evenly when ``pp`` divides them, else the middle stages even and the first and last taking the
  rest. The first stage also holds the input embedding, the last the final norm and output head;
  with tied embeddings and ``pp > 1`` the last stage keeps its own copy of the embedding matrix
  as the head, as Megatron does.
- Every parameter of a stage is split over ``tp`` ranks (norm weights, replicated in Megatron, are
  counted split: < 0.01% of the parameters).
- A model-stage processes ``job.global_batch * ms.sequences_per_prompt`` sequences per step.
  Training does ``job.minibatches`` optimizer updates per step, each over the ``n`` sequences of
  an update; generation and inference process all ``n`` sequences of the step. Each of the
  ``dp`` replicas takes a share of them: ``n / dp`` when dp divides n, else (``PlanSpace.
  uneven_dp``) ``⌈n/dp⌉`` or ``⌊n/dp⌋``; a candidate's ``micro_batch · grad_accum`` is the
  largest share, which sets its time and memory (the slowest replica). Generation in the uneven
  space decodes ``micro_batch`` sequences at once in ``grad_accum`` rounds covering the share,
  the last round possibly partial (costed as a full one).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nereus.errors import ConfigError
from nereus.spec.job import PlanSpace, Setup
from nereus.spec.model import ModelSpec, pipeline_split
from nereus.spec.plan import Candidate
from nereus.spec.workflow import ModelStage

VALUE_HEAD_ROLES = ("critic", "reward")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class PipelineStage:
    """One pipeline stage of a replica, as seen by one of its ``tp`` GPUs."""

    pp_rank: int
    num_layers: int
    first: bool  # holds the input embedding
    last: bool  # holds the final norm and the output (or value) head
    params: int  # parameters on one TP rank of this stage


@dataclass(frozen=True)
class ModelDims:
    """Parameter counts of one architecture, computed once per ``ModelSpec``."""

    num_layers: int
    layer_params: int
    matmul_params_per_layer: int
    embedding_params: int
    norm_params: int
    hidden_size: int
    q_size: int
    num_kv_heads: int
    kv_channels: int
    num_attention_heads: int


@functools.lru_cache(maxsize=256)
def model_dims(m: ModelSpec) -> ModelDims:
    norm = m.hidden_size * (1 if m.norm == "rmsnorm" else 2)
    qk = 2 * m.kv_channels if m.qk_norm else 0
    layer = m.layer_params()
    return ModelDims(
        m.num_layers, layer, layer - qk - 2 * norm, m.embedding_params(), norm,
        m.hidden_size, m.q_size, m.num_kv_heads, m.kv_channels, m.num_attention_heads,
    )


def _head_params(m: ModelSpec, head_outputs: int, pp: int) -> int:
    norm = m.hidden_size * (1 if m.norm == "rmsnorm" else 2)
    if head_outputs != m.vocab_size:
        return m.hidden_size * head_outputs + norm
    if m.tie_embeddings and pp > 1:
        return m.vocab_size * m.hidden_size + norm
    return m.head_params()


@dataclass(frozen=True)
class Workload:
    """Shapes and batch split of one model-stage candidate (per replica)."""

    model: ModelSpec
    kind: str  # "generate" | "forward" | "train"
    tp: int
    pp: int
    dp: int
    head_outputs: int  # vocab_size, or 1 for a value head
    sequences: int  # per step, whole model-stage
    updates: int  # optimizer updates per step (1 unless training)
    micro_batch: int  # sequences per micro-batch per replica
    micro_batches: int  # micro-batches per replica per update (training) or per step
    seq_len: int  # prompt + mean generated tokens (time)
    max_seq_len: int  # prompt + p95 generated tokens (memory)
    prompt_len: int
    gen_len: int  # mean generated tokens (time)
    max_gen_len: int  # p95 generated tokens (memory)
    dtype_bytes: int
    recompute: bool
    dims: ModelDims
    head_params: int  # output or value head plus final norm (last stage)

    @property
    def matmul_params_per_layer(self) -> int:
        """Parameters of one layer that take part in GEMMs (all but the norms)."""
        return self.dims.matmul_params_per_layer

    def stage(self, pp_rank: int) -> PipelineStage:
        p = self.pp
        f, m, last_layers = pipeline_split(self.dims.num_layers, p)
        first, last = pp_rank == 0, pp_rank == p - 1
        layers = f if first else (last_layers if last else m)
        params = layers * self.dims.layer_params
        if first:
            params += self.dims.embedding_params
        if last:
            params += self.head_params
        return PipelineStage(pp_rank, layers, first, last, _ceil_div(params, self.tp))

    def stages(self) -> tuple[PipelineStage, ...]:
        return tuple(self.stage(r) for r in range(self.pp))

    def distinct_stages(self) -> tuple[tuple[PipelineStage, int], ...]:
        """Stages that differ in shape, each with how many ranks share it (O(1) for any pp)."""
        return tuple((self.stage(r), n) for r, _, n in stage_groups(self.dims.num_layers, self.pp))


@dataclass(frozen=True, eq=False)
class StageContext:
    """What a model-stage's costs depend on besides the candidate (built once per setup).

    Compared and hashed by identity (value-equal setups share one context through
    ``stage_context``), so it can key memo tables cheaply; ``memo`` holds per-layout results
    that the latency and memory models compute once and reuse (deterministic: a pure cache).
    """

    name: str
    kind: str
    trainable: bool
    model: ModelSpec
    dims: ModelDims
    head_outputs: int
    sequences: int
    updates: int
    per_update: int  # sequences per update (training) or per step
    seq_len: int
    max_seq_len: int
    prompt_len: int
    gen_len: int
    max_gen_len: int
    dtype_bytes: int
    flash_attention: bool = True
    distributed_optimizer: bool = False
    space: PlanSpace = field(default_factory=PlanSpace)
    memo: dict[tuple[object, ...], object] = field(default_factory=dict, repr=False)

    def head_params(self, pp: int) -> int:
        return _head_params(self.model, self.head_outputs, pp)


# (id(setup), id(ms)) -> (setup, ms, context): skips hashing the setup when the caller passes the
# same objects again; the stored references keep the ids from being reused while cached.
_RECENT: dict[tuple[int, int], tuple[Setup, ModelStage, StageContext]] = {}
_RECENT_MAX = 256
MEMO_MAX = 1 << 16  # entries per memo table before it is cleared


def stage_context(setup: Setup, ms: ModelStage) -> StageContext:
    """The candidate-independent part of a model-stage's costs (cached)."""
    hit = _RECENT.get((id(setup), id(ms)))
    if hit is not None and hit[0] is setup and hit[1] is ms:
        return hit[2]
    ctx = _stage_context(setup, ms)
    if len(_RECENT) >= _RECENT_MAX:
        _RECENT.clear()
    _RECENT[(id(setup), id(ms))] = (setup, ms, ctx)
    return ctx


@functools.lru_cache(maxsize=1024)
def _stage_context(setup: Setup, ms: ModelStage) -> StageContext:
    job = setup.job
    try:
        model = job.model(ms.role)
    except KeyError:
        raise ConfigError("job.models", ms.role, f"no model for role of {ms.name}") from None
    sequences = job.sequences(ms.sequences_per_prompt)
    updates = job.minibatches if ms.trainable else 1
    if updates < 1 or sequences % updates:
        raise ConfigError("job.minibatches", job.minibatches, f"must divide the {sequences} sequences")
    return StageContext(
        name=ms.name,
        kind=ms.kind,
        trainable=ms.trainable,
        model=model,
        dims=model_dims(model),
        head_outputs=1 if ms.role in VALUE_HEAD_ROLES else model.vocab_size,
        sequences=sequences,
        updates=updates,
        per_update=sequences // updates,
        seq_len=job.max_seq_len if job.static_batches else job.seq_len,
        max_seq_len=job.max_seq_len,
        prompt_len=job.prompt_len,
        gen_len=(job.gen_len_p95 or job.gen_len) if job.static_batches else job.gen_len,
        max_gen_len=job.gen_len_p95 or job.gen_len,
        dtype_bytes=job.dtype_bytes,
        flash_attention=job.flash_attention,
        distributed_optimizer=job.distributed_optimizer,
        space=job.space,
    )


def largest_share(sequences: int, dp: int) -> int:
    """Sequences of the most loaded of ``dp`` replicas: ``⌈sequences / dp⌉``."""
    return -(-sequences // dp)


def check_candidate(ctx: StageContext, cand: Candidate) -> None:
    """Raise ``ConfigError`` unless ``cand`` is a valid layout and batch split for ``ctx``."""
    tp, pp, dp, b, ga = cand.tp, cand.pp, cand.dp, cand.micro_batch, cand.grad_accum
    if tp < 1 or pp < 1 or dp < 1 or b < 1 or ga < 1:
        for field, v in (("tp", tp), ("pp", pp), ("dp", dp), ("micro_batch", b), ("grad_accum", ga)):
            if v < 1:
                raise ConfigError(f"{cand.name}.{field}", v, "must be >= 1")
    if pp > ctx.dims.num_layers:
        raise ConfigError(f"{cand.name}.pp", pp, f"more stages than {ctx.dims.num_layers} layers")
    per = "update" if ctx.trainable else "step"
    if not ctx.space.uneven_dp and dp * b * ga != ctx.per_update:
        raise ConfigError(
            f"{cand.name}.dp*micro_batch*grad_accum",
            dp * b * ga,
            f"must equal the {ctx.per_update} sequences per {per}",
        )
    share = largest_share(ctx.per_update, dp)
    # generation in the uneven space may end on a partial round (b concurrent sequences)
    partial = ctx.kind == "generate" and ctx.space.uneven_dp and b * (ga - 1) < share <= b * ga
    if (b * ga != share and not partial) or dp > ctx.per_update:
        raise ConfigError(
            f"{cand.name}.micro_batch*grad_accum",
            b * ga,
            f"must equal the largest share ⌈{ctx.per_update}/dp⌉ of the sequences per {per} "
            f"(dp ≤ {ctx.per_update}; generation: rounds of micro_batch covering it)",
        )


@functools.lru_cache(maxsize=4096)
def stage_groups(num_layers: int, pp: int) -> tuple[tuple[int, int, int], ...]:
    """``(first pp_rank, layers, ranks)`` of each run of pipeline ranks with the same shape.

    Rank 0 and rank ``pp - 1`` are always their own group (embedding, head); the middle ranks
    form one group (``nereus.spec.model.pipeline_split``).
    """
    if pp == 1:
        return ((0, num_layers, 1),)
    first, mid, last = pipeline_split(num_layers, pp)
    groups = [(0, first, 1)]
    if pp > 2:
        groups.append((1, mid, pp - 2))
    groups.append((pp - 1, last, 1))
    return tuple(groups)


@dataclass(frozen=True, eq=False)
class CandidateArrays:
    """Candidates of one model-stage as parallel integer arrays (the vectorized cost model's
    input): ``tp, pp, dp, micro_batch, grad_accum`` (int64) and ``recompute`` (bool)."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    micro_batch: np.ndarray
    grad_accum: np.ndarray
    recompute: np.ndarray
    # derived arrays that depend on the layouts only (split layers, parameters per stage), keyed
    # by what they depend on: a pure cache kept as long as the candidates
    cache: dict[tuple[object, ...], tuple[np.ndarray, ...]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    @staticmethod
    def of(cands: Sequence[Candidate]) -> CandidateArrays:
        def col(attr: str) -> np.ndarray:
            return np.fromiter((getattr(c, attr) for c in cands), dtype=np.int64, count=len(cands))

        rc = np.fromiter((c.recompute for c in cands), dtype=bool, count=len(cands))
        return CandidateArrays(
            col("tp"), col("pp"), col("dp"), col("micro_batch"), col("grad_accum"), rc
        )

    def take(self, index: np.ndarray) -> CandidateArrays:
        return CandidateArrays(
            self.tp[index], self.pp[index], self.dp[index], self.micro_batch[index],
            self.grad_accum[index], self.recompute[index],
        )

    def candidate(self, name: str, i: int) -> Candidate:
        return Candidate(
            name, int(self.tp[i]), int(self.pp[i]), int(self.dp[i]), int(self.micro_batch[i]),
            int(self.grad_accum[i]), bool(self.recompute[i]),
        )


def split_arrays(num_layers: int, pp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`nereus.spec.model.pipeline_split` over an array of depths (layers of the first, a
    middle and the last stage)."""
    even = num_layers % pp == 0
    q = num_layers // pp
    mid = -(-num_layers // pp)
    rest = num_layers - (pp - 2) * mid
    low = rest < 2
    mid = np.where(low, q, mid)
    rest = np.where(low, num_layers - (pp - 2) * q, rest)
    first = -(-rest // 2)
    last = rest - first
    two_first = -(-num_layers // 2)
    first = np.where(pp == 2, two_first, first)
    last = np.where(pp == 2, num_layers - two_first, last)
    mid = np.where(pp == 2, two_first, mid)
    first = np.where(even, q, first)
    mid = np.where(even, q, mid)
    last = np.where(even, q, last)
    return first, mid, last


def workload(setup: Setup, ms: ModelStage, cand: Candidate) -> Workload:
    """Check ``cand`` against ``ms`` and the job, and return its per-replica shapes."""
    ctx = stage_context(setup, ms)
    check_candidate(ctx, cand)
    return Workload(
        model=ctx.model,
        kind=ctx.kind,
        tp=cand.tp,
        pp=cand.pp,
        dp=cand.dp,
        head_outputs=ctx.head_outputs,
        sequences=ctx.sequences,
        updates=ctx.updates,
        micro_batch=cand.micro_batch,
        micro_batches=cand.grad_accum,
        seq_len=ctx.seq_len,
        max_seq_len=ctx.max_seq_len,
        prompt_len=ctx.prompt_len,
        gen_len=ctx.gen_len,
        max_gen_len=ctx.max_gen_len,
        dtype_bytes=ctx.dtype_bytes,
        recompute=cand.recompute and ctx.trainable,
        dims=ctx.dims,
        head_params=ctx.head_params(cand.pp),
    )


def clear_caches() -> None:
    """Forget the memoized stage contexts (tests of cold-cache behaviour)."""
    _RECENT.clear()
    _stage_context.cache_clear()
