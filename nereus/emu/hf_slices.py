"""What one rank reads of a Hugging Face checkpoint for its shard, and where it goes (pure).

A Megatron logical tensor (:mod:`nereus.emu.shards`) is made of *segments*: ranges of its rows
(axis 0) that come from one Hugging Face tensor's rows, every other axis unchanged
(:mod:`nereus.emu.hf_layout` gives the names): the fused QKV weight and bias are, per query
group, its query rows (from ``q_proj``), its key rows (``k_proj``) and its value rows
(``v_proj``); the fused SwiGLU ``linear_fc1`` is ``gate_proj`` then ``up_proj``; every other
tensor is one Hugging Face tensor. A rank's shard is boxes of the logical tensors
(:func:`nereus.emu.shards.shards_at`), so cutting each box along the segments gives exactly the
slices of Hugging Face tensors that rank reads (:func:`shard_reads`): no rank reads a byte
outside its shard, and replicated tensors (norms) are read by every tp rank that holds them.

The output layer depends on the model's head (:data:`HEADS`):

- ``lm_head``: a causal LM's ``lm_head.weight`` (absent when the embeddings are tied);
- ``score``: row 0 from the ``score.weight`` [1, hidden] of a ``*ForSequenceClassification``
  (a reward model) or ``*ForTokenClassification`` (a critic) checkpoint, the other rows zero: the
  runtime reads a scalar head as column 0 of its output (:mod:`nereus.engines.forward`);
- ``new``: a new scalar value head on a causal LM's trunk (a critic from the actor's
  checkpoint): row 0 drawn from a normal distribution of mean 0 and standard deviation
  1/(hidden + 1), as OpenRLHF initialises its value head
  (:func:`value_head_row`, one draw per seed, so every layout gets the same row), the other
  rows zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nereus.emu.boxes import Box, intersect
from nereus.emu.hf_layout import (
    FC1,
    GLOBAL_NAMES,
    HF_FC1,
    HF_QKV,
    HF_QKV_BIAS,
    LAYER_NAMES,
    QKV,
    QKV_BIAS,
    layer_of,
)
from nereus.emu.shards import LocalShard, Piece, TensorSpec, shards_at, tensor_specs
from nereus.emu.unit import Layout
from nereus.spec.model import ModelSpec

LM_HEAD, SCORE, NEW_HEAD = "lm_head", "score", "new"
HEADS = (LM_HEAD, SCORE, NEW_HEAD)
OUTPUT = "output_layer.weight"
ZERO = ""  # a segment of zeros (the unused rows of a scalar head)
VALUE = "<value-head>"  # the new value head's row (value_head_row)
SCORE_WEIGHT = "score.weight"


@dataclass(frozen=True)
class Segment:
    """Rows ``[start, stop)`` of a Megatron tensor come from rows ``[source_start, …)`` of the
    Hugging Face tensor ``source`` (or are zeros: ``ZERO``; or the new value head: ``VALUE``)."""

    start: int
    stop: int
    source: str
    source_start: int = 0


@dataclass(frozen=True)
class SliceRead:
    """One slice: ``source_box`` of Hugging Face tensor ``source`` fills ``target_box`` of the
    Megatron logical tensor ``tensor`` (same shape)."""

    tensor: str
    source: str
    source_box: Box
    target_box: Box

    @property
    def reads_file(self) -> bool:
        return self.source not in (ZERO, VALUE)


def head_of(spec: ModelSpec, head: str) -> str:
    """``head`` checked against ``spec``: a scalar head needs an untied output layer."""
    if head not in HEADS:
        raise ValueError(f"head {head!r} is not one of {HEADS}")
    if head != LM_HEAD and spec.tie_embeddings:
        raise ValueError(f"{spec.name}: a {head!r} head needs untied embeddings")
    return head


def segments(spec: ModelSpec, t: TensorSpec, head: str = LM_HEAD) -> tuple[Segment, ...]:
    """The segments of logical tensor ``t`` (rows along axis 0)."""
    rows = t.global_shape[0]
    if t.name == OUTPUT and head != LM_HEAD:
        first = SCORE_WEIGHT if head == SCORE else VALUE
        return (Segment(0, 1, first), Segment(1, rows, ZERO))
    if t.name in GLOBAL_NAMES:
        return (Segment(0, rows, GLOBAL_NAMES[t.name]),)
    at = layer_of(t.name)
    if at is None:
        raise ValueError(f"{t.name!r} has no Hugging Face counterpart")
    layer, rest = at
    prefix = f"model.layers.{layer}."
    if rest in (QKV, QKV_BIAS):
        q, k, v = (prefix + n for n in (HF_QKV if rest == QKV else HF_QKV_BIAS))
        d, groups = spec.kv_channels, spec.num_kv_heads
        per = spec.num_attention_heads // groups
        out: list[Segment] = []
        for g in range(groups):
            base = g * (per + 2) * d
            out += [Segment(base, base + per * d, q, g * per * d),
                    Segment(base + per * d, base + (per + 1) * d, k, g * d),
                    Segment(base + (per + 1) * d, base + (per + 2) * d, v, g * d)]
        return tuple(out)
    if rest == FC1:
        ffn = spec.ffn_hidden_size
        return (Segment(0, ffn, prefix + HF_FC1[0]), Segment(ffn, 2 * ffn, prefix + HF_FC1[1]))
    return (Segment(0, rows, prefix + LAYER_NAMES[rest]),)


def box_reads(spec: ModelSpec, t: TensorSpec, box: Box,
              head: str = LM_HEAD) -> tuple[SliceRead, ...]:
    """The slices that fill ``box`` of logical tensor ``t``, in row order."""
    out = []
    for seg in segments(spec, t, head):
        seg_box = Box((seg.start, *box.start[1:]), (seg.stop, *box.stop[1:]))
        common = intersect(seg_box, box)
        if common is None:
            continue
        offset = (seg.source_start - seg.start, *(0 for _ in box.start[1:]))
        out.append(SliceRead(t.name, seg.source, common.shift(offset), common))
    return tuple(out)


def shard_reads(spec: ModelSpec, layout: Layout, pp_rank: int, tp_rank: int,
                head: str = LM_HEAD) -> tuple[tuple[LocalShard, Piece, SliceRead], ...]:
    """Every slice position (pp_rank, tp_rank) of a unit with ``layout`` reads for its shard,
    with the shard and piece it fills (a read's ``target_box`` lies inside the piece's global
    box)."""
    head_of(spec, head)
    by_name = {t.name: t for t in tensor_specs(spec)}
    out = []
    for s in shards_at(spec, layout, pp_rank, tp_rank):
        for pc in s.pieces:
            for r in box_reads(spec, by_name[s.tensor], pc.global_, head):
                out.append((s, pc, r))
    return tuple(out)


def needed_tensors(spec: ModelSpec, head: str = LM_HEAD) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor a full load of ``spec`` with ``head`` reads, and its shape."""
    head_of(spec, head)
    out: dict[str, tuple[int, ...]] = {}
    for t in tensor_specs(spec):
        for seg in segments(spec, t, head):
            if seg.source in (ZERO, VALUE):
                continue
            if seg.source == SCORE_WEIGHT:
                out[seg.source] = (1, spec.hidden_size)
                continue
            rows = out.get(seg.source, (0,))[0]
            out[seg.source] = (max(rows, seg.source_start + seg.stop - seg.start),
                               *t.global_shape[1:])
    return out


def value_head_row(hidden_size: int, seed: int) -> np.ndarray:
    """[hidden] fp32: the new value head's weights, normal with standard deviation
    1/(hidden + 1) (OpenRLHF's value-head initialisation), drawn from ``seed`` alone."""
    rng = np.random.Generator(np.random.PCG64([seed, 0x76616C7565]))
    return (rng.standard_normal(hidden_size) / (hidden_size + 1)).astype(np.float32)


def bytes_of_reads(reads: tuple[tuple[LocalShard, Piece, SliceRead], ...] | tuple[SliceRead, ...],
                   itemsize: dict[str, int]) -> int:
    """Bytes the file reads among ``reads`` take, at each source tensor's ``itemsize``."""
    total = 0
    for item in reads:
        r = item if isinstance(item, SliceRead) else item[2]
        if r.reads_file:
            total += r.source_box.volume * itemsize[r.source]
    return total
