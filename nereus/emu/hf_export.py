"""Which rank writes which Hugging Face tensors into which file, from any tp×pp layout (pure).

An export is written by the ranks of one replica of a unit, each from its own place: the
tensors of pipeline stage ``p`` are written by that stage's ranks, spread over its tp ranks so
that each writes about ``1/tp`` of the stage's bytes (greedily, in logical order), and each
writer cuts its share into files of at most ``max_file_bytes`` (a larger tensor gets a file of
its own). A tp-sharded tensor is gathered onto its writer over the stage's tp group alone, so no
rank holds more than its share of the model besides its own shard. The files are numbered
across the whole unit (``model-00003-of-00008.safetensors``), so every rank knows every name
before anything is written and the index is known in advance (:func:`index_of`).

What a logical tensor becomes: :func:`nereus.emu.hf_layout.hf_tensors` for a causal LM; the
scalar head of a critic (``head`` ``score`` or ``new``) is exported as a
``*ForTokenClassification``'s ``score.weight`` (row 0 of the output layer, [1, hidden]) and a
zero ``score.bias`` [1].
"""

from __future__ import annotations

from dataclasses import dataclass

from nereus.emu.hf_layout import GLOBAL_NAMES, hf_shapes
from nereus.emu.hf_slices import LM_HEAD, OUTPUT, head_of, segments
from nereus.emu.shards import stage_of, tensor_specs
from nereus.emu.unit import Layout
from nereus.spec.model import ModelSpec


@dataclass(frozen=True)
class ExportFile:
    """One safetensors file: its name, its writer's position, the logical tensors whose Hugging
    Face tensors it holds (``hf``: their names and shapes) and their bytes."""

    name: str
    pp_rank: int
    tp_rank: int
    tensors: tuple[str, ...]
    hf: tuple[tuple[str, tuple[int, ...]], ...]
    nbytes: int


def hf_parts(spec: ModelSpec, tensor: str, head: str = LM_HEAD) -> tuple[tuple[str, tuple[int,
                                                                                         ...]], ...]:
    """(Hugging Face name, shape) of what logical ``tensor`` is exported as."""
    head_of(spec, head)
    if tensor == OUTPUT and head != LM_HEAD:
        return (("score.weight", (1, spec.hidden_size)), ("score.bias", (1,)))
    shapes = hf_shapes(spec)
    if tensor in GLOBAL_NAMES:
        return ((GLOBAL_NAMES[tensor], shapes[GLOBAL_NAMES[tensor]]),)
    t = next(x for x in tensor_specs(spec) if x.name == tensor)
    names: list[str] = []
    for seg in segments(spec, t, head):
        if seg.source not in names:
            names.append(seg.source)
    return tuple((n, shapes[n]) for n in names)  # q, k, v / gate, up: first rows first


def export_plan(spec: ModelSpec, layout: Layout, itemsize: int, max_file_bytes: int,
                head: str = LM_HEAD) -> tuple[ExportFile, ...]:
    """The files of an export of ``spec`` written from a unit of ``layout`` (every tensor
    stored at ``itemsize`` bytes per value)."""
    if max_file_bytes <= 0:
        raise ValueError("max_file_bytes must be positive")
    by_stage: dict[int, list[str]] = {p: [] for p in range(layout.pp)}
    for t in tensor_specs(spec):
        by_stage[stage_of(t, spec, layout.pp)].append(t.name)
    drafts: list[tuple[int, int, list[str], list[tuple[str, tuple[int, ...]]], int]] = []
    for p in range(layout.pp):
        share = [0] * layout.tp
        mine: dict[int, list[str]] = {r: [] for r in range(layout.tp)}
        for name in by_stage[p]:
            nbytes = _bytes(hf_parts(spec, name, head), itemsize)
            r = min(range(layout.tp), key=lambda i: (share[i], i))
            if name == OUTPUT and head != LM_HEAD:
                r = 0  # the scalar head's row 0 lives on tp rank 0: nothing to gather
            share[r] += nbytes
            mine[r].append(name)
        for r in range(layout.tp):
            current: list[str] = []
            parts: list[tuple[str, tuple[int, ...]]] = []
            size = 0
            for name in mine[r]:
                hf = list(hf_parts(spec, name, head))
                nbytes = _bytes(hf, itemsize)
                if current and size + nbytes > max_file_bytes:
                    drafts.append((p, r, current, parts, size))
                    current, parts, size = [], [], 0
                current.append(name)
                parts += hf
                size += nbytes
            if current:
                drafts.append((p, r, current, parts, size))
    n = len(drafts)
    return tuple(ExportFile(f"model-{i + 1:05d}-of-{n:05d}.safetensors", p, r, tuple(names),
                            tuple(parts), size)
                 for i, (p, r, names, parts, size) in enumerate(drafts))


def _bytes(parts: tuple[tuple[str, tuple[int, ...]], ...] | list[tuple[str, tuple[int, ...]]],
           itemsize: int) -> int:
    total = 0
    for _, shape in parts:
        v = 1
        for d in shape:
            v *= d
        total += v * itemsize
    return total


def index_of(files: tuple[ExportFile, ...]) -> dict[str, object]:
    """``model.safetensors.index.json`` of an export (Hugging Face's sharded-checkpoint index:
    the data bytes and every tensor's file)."""
    weight_map = {name: f.name for f in files for name, _ in f.hf}
    return {"metadata": {"total_size": sum(f.nbytes for f in files)},
            "weight_map": dict(sorted(weight_map.items()))}
