"""Pipeline-parallel forward and backward of one unit's Megatron GPTModel stages over gloo
(effectful).

Megatron-core 0.16.1's schedules (``megatron.core.pipeline_parallel``) cannot run here: the
schedules allocate ``total_num_tokens`` with ``device="cuda"`` and the p2p layer builds its shape
tensors on ``torch.cuda.current_device()``. This module is the CPU schedule: activations
[s, b, hidden] go from stage k to stage k+1 at the same tp position with torch.distributed
``isend``/``recv`` on the unit's pp group (passed explicitly), non-first stages take them through
``model.set_input_tensor``, the loss is computed on the last stage only, and backward sends the
input gradient back to stage k-1.

Training runs the non-interleaved **1F1B** schedule (Megatron's ``PipeDream-Flush``): stage k
runs ``pp - k - 1`` warm-up forwards, then alternates one forward and one backward, then drains
the remaining backwards. Backwards run in microbatch order on every stage, so gradients
accumulate in the same order as at pp=1 (where the schedule is forward, backward per
microbatch). Shapes need no exchange: every stage knows the microbatch's tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from nereus.emu.unit import Emu
from nereus.engines.vocab import full_vocab

LossFn = Callable[[int, torch.Tensor], torch.Tensor]  # (microbatch index, logits) → loss


@dataclass(frozen=True)
class StageLink:
    """One rank's place in its unit's pipeline: ``pp_rank`` of ``pp``, the global ranks of the
    previous, next and last stage at its tp position (None past the ends), the unit's pp group
    and the model's hidden size (the activation width)."""

    pp_rank: int
    pp: int
    prev_rank: int | None
    next_rank: int | None
    last_rank: int
    group: Any  # dist.ProcessGroup (the pp group of this rank's tp position)
    hidden_size: int

    @property
    def first(self) -> bool:
        return self.pp_rank == 0

    @property
    def last(self) -> bool:
        return self.pp_rank == self.pp - 1


def stage_link(emu: Emu, global_rank: int, pp_group: Any, hidden_size: int) -> StageLink:
    """The link of ``global_rank`` in ``emu`` (``pp_group``: its pp group from ``unit_groups``)."""
    pp_rank, tp_rank = divmod(emu.gpus.index(global_rank), emu.layout.tp)
    pp = emu.layout.pp
    prev_rank = emu.gpu_at(pp_rank - 1, tp_rank) if pp_rank > 0 else None
    next_rank = emu.gpu_at(pp_rank + 1, tp_rank) if pp_rank < pp - 1 else None
    return StageLink(pp_rank, pp, prev_rank, next_rank, emu.gpu_at(pp - 1, tp_rank), pp_group,
                     hidden_size)


def _positions(tokens: torch.Tensor) -> torch.Tensor:
    return torch.arange(tokens.shape[1]).expand_as(tokens)


def _recv(link: StageLink, src: int | None, shape: tuple[int, ...], tag: int) -> torch.Tensor:
    buf = torch.empty(shape, dtype=torch.float32)
    dist.recv(buf, src=src, group=link.group, tag=tag)
    return buf


def _stage_out(model: torch.nn.Module, link: StageLink, tokens: torch.Tensor,
               received: torch.Tensor | None) -> torch.Tensor:
    if not link.first:
        model.set_input_tensor(received)  # type: ignore[operator]
    out: torch.Tensor = model(tokens, _positions(tokens), None)
    return out


def _act_shape(link: StageLink, tokens: torch.Tensor) -> tuple[int, int, int]:
    return tokens.shape[1], tokens.shape[0], link.hidden_size  # Megatron's [s, b, h]


def forward_logits(model: torch.nn.Module, link: StageLink, tp_group: Any,
                   tokens: torch.Tensor) -> torch.Tensor | None:
    """Forward only (no grad): full-vocabulary logits [b, s, vocab] of ``tokens`` [b, s] on the
    last stage, None on the others. Every rank of the unit calls it with the same tokens."""
    with torch.no_grad():
        received = None
        if not link.first:
            received = _recv(link, link.prev_rank, _act_shape(link, tokens), tag=0)
        out = _stage_out(model, link, tokens, received)
        if not link.last:
            dist.send(out.contiguous(), dst=link.next_rank, group=link.group, tag=0)
            return None
        return full_vocab(model, out, tp_group)


def forward_cached(model: torch.nn.Module, link: StageLink, tokens: torch.Tensor,
                   positions: torch.Tensor, ctx: Any) -> torch.Tensor | None:
    """One KV-cache forward (prefill or decode) through the pipeline, no grad: the output layer's
    logits on the last stage (Megatron returns the last position only), None elsewhere. Each
    stage keeps the KV cache of its own layers in ``ctx``."""
    with torch.no_grad():
        if not link.first:
            received = _recv(link, link.prev_rank, _act_shape(link, tokens), tag=0)
            model.set_input_tensor(received)  # type: ignore[operator]
        out: torch.Tensor = model(tokens, positions, None, inference_context=ctx,
                                  runtime_gather_output=True)
        if not link.last:
            dist.send(out.contiguous(), dst=link.next_rank, group=link.group, tag=0)
            return None
        return out


def from_last(link: StageLink, value: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``value`` computed on the last stage, broadcast to every stage at this tp position
    (``like`` gives the shape and dtype on the others)."""
    if link.pp == 1:
        if value is None:
            raise ValueError("a single-stage unit computes every value itself")
        return value
    buf = value.contiguous() if value is not None else torch.empty_like(like)
    dist.broadcast(buf, src=link.last_rank, group=link.group)
    return buf


def forward_backward(model: torch.nn.Module, link: StageLink, tp_group: Any,
                     microbatches: Sequence[torch.Tensor], loss_fn: LossFn) -> float:
    """1F1B over ``microbatches`` (token tensors [b_i, s]); gradients accumulate in the model's
    ``.grad``. ``loss_fn(i, logits)`` runs on the last stage; returns the sum of its values there
    (0.0 on the other stages)."""
    n = len(microbatches)
    inputs: dict[int, torch.Tensor | None] = {}
    outputs: dict[int, torch.Tensor] = {}
    sends: list[Any] = []
    total = 0.0

    def forward(i: int) -> None:
        nonlocal total
        tokens = microbatches[i]
        received = None
        if not link.first:
            received = _recv(link, link.prev_rank, _act_shape(link, tokens), tag=2 * i)
            received.requires_grad_(True)
        out = _stage_out(model, link, tokens, received)
        inputs[i] = received
        if link.last:
            loss = loss_fn(i, full_vocab(model, out, tp_group))
            total += float(loss.detach())
            outputs[i] = loss
        else:
            sends.append(dist.isend(out.detach().contiguous(), dst=link.next_rank,
                                    group=link.group, tag=2 * i))
            outputs[i] = out

    def backward(i: int) -> None:
        out, received = outputs.pop(i), inputs.pop(i)
        if link.last:
            out.backward()
        else:
            grad = _recv(link, link.next_rank, tuple(out.shape), tag=2 * i + 1)
            out.backward(grad)
        if received is not None:
            if received.grad is None:
                raise RuntimeError(f"pipeline stage {link.pp_rank}: no input gradient")
            sends.append(dist.isend(received.grad.contiguous(), dst=link.prev_rank,
                                    group=link.group, tag=2 * i + 1))

    warmup = min(link.pp - link.pp_rank - 1, n)
    done_f = done_b = 0
    for _ in range(warmup):
        forward(done_f)
        done_f += 1
    while done_f < n:
        forward(done_f)
        done_f += 1
        backward(done_b)
        done_b += 1
    while done_b < n:
        backward(done_b)
        done_b += 1
    for w in sends:
        w.wait()
    return total
