"""Per-tensor shard rules of a Megatron-core GPTModel under a tp×pp layout (pure).

The logical (global) state is one tensor per parameter, named like Megatron's state-dict key but
with the *global* layer index (``decoder.layers.{L}.…``). Megatron's ``sharded_state_dict()``
reports every local tensor as boxes of such global tensors; the rules below reproduce that
metadata (checked against real Megatron models in ``tests/ranks/test_emu_shards_megatron.py``):

- column-parallel (``linear_qkv`` and its bias, non-gated ``linear_fc1``, ``output_layer``): axis 0 in tp
  contiguous chunks. The fused QKV global tensor is Megatron's own group-interleaved layout
  ``[g0: q…, k, v | g1: …]``, so tp chunks are whole query groups;
- gated ``linear_fc1`` (SwiGLU): the global tensor is ``[gate; up]`` (2·ffn rows); tp rank r holds
  ``[gate chunk r; up chunk r]`` — two boxes, not one contiguous chunk (Megatron's
  ``apply_swiglu_sharded_factory``);
- row-parallel (``linear_proj``, ``linear_fc2``): axis 1 in tp chunks;
- vocab-parallel (``word_embeddings``): axis 0 in tp chunks;
- replicated over tp: norms, position embeddings;
- pipeline: stage s holds layers [s·L/pp, (s+1)·L/pp); embeddings on the first stage, final norm
  and output layer on the last. Where ``pp`` does not divide the layers (the uneven pipeline of
  the plan space, built by ``nereus.engines.megatron_model``) the stages hold Megatron's uneven
  split, ``nereus.spec.model.stage_layer_counts``, in order.
"""

from __future__ import annotations

from dataclasses import dataclass

from nereus.emu.boxes import Box
from nereus.emu.unit import Layout
from nereus.errors import ConfigError
from nereus.spec.model import ModelSpec, stage_layer_counts

COLUMN = "column"
ROW = "row"
VOCAB = "vocab"
GATE_UP = "gate_up"
REPLICATED = "replicated"


@dataclass(frozen=True)
class TensorSpec:
    """One logical tensor: its name, global shape, how tp splits it, and its owning layer."""

    name: str
    global_shape: tuple[int, ...]
    kind: str
    layer: int | None  # global layer index; None for embeddings / head tensors
    place: str = "layer"  # "first" (embeddings) | "layer" | "last" (final norm, head)


@dataclass(frozen=True)
class Piece:
    """A part of a local tensor: ``local`` box of the local tensor holds ``global_`` of the tensor."""

    local: Box
    global_: Box


@dataclass(frozen=True)
class LocalShard:
    """What position (pp_rank, tp_rank) of a unit holds of one logical tensor."""

    tensor: str
    local_key: str
    pp_rank: int
    tp_rank: int
    local_shape: tuple[int, ...]
    pieces: tuple[Piece, ...]
    tp_replica: bool  # True on every tp rank but 0 for tensors replicated over tp


def _norm_tensors(spec: ModelSpec, prefix: str, size: int, layer: int | None,
                  place: str) -> list[TensorSpec]:
    out = [TensorSpec(f"{prefix}.weight", (size,), REPLICATED, layer, place)]
    if spec.norm == "layernorm":
        out.append(TensorSpec(f"{prefix}.bias", (size,), REPLICATED, layer, place))
    return out


def tensor_specs(spec: ModelSpec) -> tuple[TensorSpec, ...]:
    """Every logical tensor of the GPTModel built by ``nereus.engines.megatron_model``."""
    h = spec.hidden_size
    out: list[TensorSpec] = [
        TensorSpec("embedding.word_embeddings.weight", (spec.vocab_size, h), VOCAB, None, "first"),
    ]
    if spec.learned_positions:
        out.append(TensorSpec("embedding.position_embeddings.weight", (spec.max_seq_len, h),
                              REPLICATED, None, "first"))
    qkv_rows = spec.q_size + 2 * spec.kv_size
    for layer in range(spec.num_layers):
        p = f"decoder.layers.{layer}"
        out += _norm_tensors(spec, f"{p}.input_layernorm", h, layer, "layer")
        out.append(TensorSpec(f"{p}.self_attention.linear_qkv.weight", (qkv_rows, h), COLUMN,
                              layer))
        if spec.qkv_bias:  # Qwen2: the fused q/k/v bias, split by tp like the weight's rows
            out.append(TensorSpec(f"{p}.self_attention.linear_qkv.bias", (qkv_rows,), COLUMN,
                                  layer))
        if spec.qk_norm:
            out += _norm_tensors(spec, f"{p}.self_attention.q_layernorm", spec.kv_channels, layer,
                                 "layer")
            out += _norm_tensors(spec, f"{p}.self_attention.k_layernorm", spec.kv_channels, layer,
                                 "layer")
        out.append(TensorSpec(f"{p}.self_attention.linear_proj.weight", (h, spec.q_size), ROW,
                              layer))
        out += _norm_tensors(spec, f"{p}.pre_mlp_layernorm", h, layer, "layer")
        if spec.gated_mlp:
            out.append(TensorSpec(f"{p}.mlp.linear_fc1.weight", (2 * spec.ffn_hidden_size, h),
                                  GATE_UP, layer))
        else:
            out.append(TensorSpec(f"{p}.mlp.linear_fc1.weight", (spec.ffn_hidden_size, h),
                                  COLUMN, layer))
        out.append(TensorSpec(f"{p}.mlp.linear_fc2.weight", (h, spec.ffn_hidden_size), ROW,
                              layer))
    out += _norm_tensors(spec, "decoder.final_layernorm", h, None, "last")
    if not spec.tie_embeddings:
        out.append(TensorSpec("output_layer.weight", (spec.vocab_size, h), COLUMN, None, "last"))
    return tuple(out)


def check_layout(spec: ModelSpec, layout: Layout) -> None:
    """Raise ConfigError when ``spec`` cannot be laid out as ``layout``: the rules of the shard
    metadata and of the runtime's Megatron units (a ``pp`` that does not divide the layers takes
    Megatron's uneven split, ``nereus.spec.model.pipeline_split``)."""
    tp, pp = layout.tp, layout.pp
    rules = [
        (pp <= spec.num_layers, "layout.pp", pp,
         f"must be at most num_layers={spec.num_layers} (one layer per stage at least)"),
        (spec.num_kv_heads % tp == 0, "layout.tp", tp, f"must divide num_kv_heads={spec.num_kv_heads}"),
        (spec.vocab_size % tp == 0, "layout.tp", tp, f"must divide vocab_size={spec.vocab_size}"),
        (spec.ffn_hidden_size % tp == 0, "layout.tp", tp, "must divide ffn_hidden_size"),
        (not (spec.tie_embeddings and pp > 1), "layout.pp", pp,
         "tied embeddings are supported only with pp=1"),
    ]
    for ok, field, value, rule in rules:
        if not ok:
            raise ConfigError(field, value, rule)


def stage_of(t: TensorSpec, spec: ModelSpec, pp: int) -> int:
    """The pipeline rank holding tensor ``t``."""
    if t.place == "first":
        return 0
    if t.place == "last":
        return pp - 1
    assert t.layer is not None
    if spec.num_layers % pp == 0:
        return t.layer // (spec.num_layers // pp)
    end = 0
    for rank, n in enumerate(stage_layer_counts(spec.num_layers, pp)):
        end += n
        if t.layer < end:
            return rank
    raise ConfigError("layer", t.layer, f"must be below num_layers={spec.num_layers}")


def stage_layers(spec: ModelSpec, pp: int, pp_rank: int) -> range:
    """Global layer indices held by pipeline rank ``pp_rank``."""
    if spec.num_layers % pp == 0:
        per = spec.num_layers // pp
        return range(pp_rank * per, (pp_rank + 1) * per)
    counts = stage_layer_counts(spec.num_layers, pp)
    start = sum(counts[:pp_rank])
    return range(start, start + counts[pp_rank])


def local_key(t: TensorSpec, spec: ModelSpec, pp: int) -> str:
    """The key of ``t`` in the stage model's ``state_dict()`` (local layer index)."""
    if t.layer is None:
        return t.name
    local = t.layer - stage_layers(spec, pp, stage_of(t, spec, pp)).start
    return t.name.replace(f"decoder.layers.{t.layer}.", f"decoder.layers.{local}.", 1)


def _chunk(shape: tuple[int, ...], axis: int, tp: int, tp_rank: int) -> Box:
    n = shape[axis] // tp
    start = [0] * len(shape)
    stop = list(shape)
    start[axis], stop[axis] = tp_rank * n, (tp_rank + 1) * n
    return Box(tuple(start), tuple(stop))


def pieces_of(t: TensorSpec, tp: int, tp_rank: int) -> tuple[Piece, ...]:
    """How tp rank ``tp_rank`` composes its local tensor from boxes of the global tensor."""
    shape = t.global_shape
    if t.kind == REPLICATED:
        full = Box.of_shape(shape)
        return (Piece(full, full),)
    if t.kind in (COLUMN, VOCAB, ROW):
        g = _chunk(shape, 1 if t.kind == ROW else 0, tp, tp_rank)
        return (Piece(g.shift(tuple(-s for s in g.start)), g),)
    if t.kind == GATE_UP:
        half = shape[0] // 2
        n = half // tp
        rest = tuple(shape[1:])
        zeros = tuple(0 for _ in rest)
        gate = Box((tp_rank * n, *zeros), ((tp_rank + 1) * n, *rest))
        up = gate.shift((half, *zeros))
        return (
            Piece(Box((0, *zeros), (n, *rest)), gate),
            Piece(Box((n, *zeros), (2 * n, *rest)), up),
        )
    raise ValueError(f"unknown shard kind {t.kind!r} of {t.name}")


def local_shape_of(t: TensorSpec, tp: int) -> tuple[int, ...]:
    shape = list(t.global_shape)
    if t.kind in (COLUMN, VOCAB, GATE_UP):
        shape[0] //= tp
    elif t.kind == ROW:
        shape[1] //= tp
    return tuple(shape)


def shards_at(spec: ModelSpec, layout: Layout, pp_rank: int, tp_rank: int) -> tuple[LocalShard, ...]:
    """Every local shard held by position (pp_rank, tp_rank) of a unit with ``layout``."""
    check_layout(spec, layout)
    out: list[LocalShard] = []
    for t in tensor_specs(spec):
        if stage_of(t, spec, layout.pp) != pp_rank:
            continue
        out.append(LocalShard(
            tensor=t.name,
            local_key=local_key(t, spec, layout.pp),
            pp_rank=pp_rank,
            tp_rank=tp_rank,
            local_shape=local_shape_of(t, layout.tp),
            pieces=pieces_of(t, layout.tp, tp_rank),
            tp_replica=t.kind == REPLICATED and tp_rank != 0,
        ))
    return tuple(out)


def state_values(spec: ModelSpec) -> int:
    """Number of parameter values of the logical state (one field: params only)."""
    total = 0
    for t in tensor_specs(spec):
        total += Box.of_shape(t.global_shape).volume
    return total
