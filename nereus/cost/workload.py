"""What one replica of a model-stage candidate holds and processes: pipeline stages and batches.

Assumptions shared by the latency and memory models:

- The model of a model-stage is ``job.model(ms.role)``. Critic and reward models use the same
  trunk with a scalar value head (one output instead of ``vocab_size``; its size is negligible).
- Layers are split over ``pp`` stages as evenly as possible, earlier stages taking the remainder
  (Megatron's default when divisible). The first stage also holds the input embedding, the last
  the final norm and output head; with tied embeddings and ``pp > 1`` the last stage keeps its own
  copy of the embedding matrix as the head, as Megatron does.
- Every parameter of a stage is split over ``tp`` ranks (norm weights, replicated in Megatron, are
  counted split: < 0.01% of the parameters).
- A model-stage processes ``job.global_batch * ms.sequences_per_prompt`` sequences per step.
  Training does ``job.minibatches`` optimizer updates per step, each over
  ``dp * micro_batch * grad_accum`` sequences; generation and inference process all sequences of
  the step in ``dp * micro_batch * grad_accum`` (grad_accum = micro-batches in sequence).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from nereus.errors import ConfigError
from nereus.spec.job import Setup
from nereus.spec.model import ModelSpec
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


@functools.lru_cache(maxsize=256)
def model_dims(m: ModelSpec) -> ModelDims:
    norm = m.hidden_size * (1 if m.norm == "rmsnorm" else 2)
    qk = 2 * m.kv_channels if m.qk_norm else 0
    layer = m.layer_params()
    return ModelDims(m.num_layers, layer, layer - qk - 2 * norm, m.embedding_params(), norm)


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
        L, p = self.dims.num_layers, self.pp
        layers = L // p + (1 if pp_rank < L % p else 0)
        first, last = pp_rank == 0, pp_rank == p - 1
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
        p = self.pp
        if p == 1:
            return ((self.stage(0), 1),)
        big = max(0, min(self.model.num_layers % p, p - 1) - 1)  # middle ranks with one more layer
        small = (p - 2) - big
        groups = [(self.stage(0), 1)]
        if big:
            groups.append((self.stage(1), big))
        if small:
            groups.append((self.stage(1 + big), small))
        groups.append((self.stage(p - 1), 1))
        return tuple(groups)


def workload(setup: Setup, ms: ModelStage, cand: Candidate) -> Workload:
    """Check ``cand`` against ``ms`` and the job, and return its per-replica shapes."""
    job = setup.job
    try:
        model = job.model(ms.role)
    except KeyError:
        raise ConfigError("job.models", ms.role, f"no model for role of {ms.name}") from None
    for field, v in (("tp", cand.tp), ("pp", cand.pp), ("dp", cand.dp),
                     ("micro_batch", cand.micro_batch), ("grad_accum", cand.grad_accum)):
        if v < 1:
            raise ConfigError(f"{cand.name}.{field}", v, "must be >= 1")
    if cand.pp > model.num_layers:
        raise ConfigError(f"{cand.name}.pp", cand.pp, f"more stages than {model.num_layers} layers")
    sequences = job.sequences(ms.sequences_per_prompt)
    updates = job.minibatches if ms.trainable else 1
    per_update = sequences // updates
    if per_update * updates != sequences or cand.dp * cand.micro_batch * cand.grad_accum != per_update:
        raise ConfigError(
            f"{cand.name}.dp*micro_batch*grad_accum",
            cand.dp * cand.micro_batch * cand.grad_accum,
            f"must equal the {per_update} sequences per {'update' if ms.trainable else 'step'}",
        )
    head = 1 if ms.role in VALUE_HEAD_ROLES else model.vocab_size
    return Workload(
        model=model,
        kind=ms.kind,
        tp=cand.tp,
        pp=cand.pp,
        dp=cand.dp,
        head_outputs=head,
        sequences=sequences,
        updates=updates,
        micro_batch=cand.micro_batch,
        micro_batches=cand.grad_accum,
        seq_len=job.seq_len,
        max_seq_len=job.max_seq_len,
        prompt_len=job.prompt_len,
        gen_len=job.gen_len,
        max_gen_len=job.gen_len_p95 or job.gen_len,
        dtype_bytes=job.dtype_bytes,
        recompute=cand.recompute and ms.trainable,
        dims=model_dims(model),
        head_params=_head_params(model, head, cand.pp),
    )
