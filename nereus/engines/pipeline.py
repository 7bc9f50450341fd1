"""Pipeline-parallel forward and backward of one unit's Megatron GPTModel stages (effectful):
our 1F1B over gloo on CPU ranks (and GPU ranks whose pp group is the host transport), Megatron's
own schedules on GPUs whose pp group is a device communicator.

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
from nereus.engines.masks import attention_mask, positions_of
from nereus.engines.vocab import full_vocab

LossFn = Callable[[int, torch.Tensor], torch.Tensor]  # (microbatch index, logits) → loss
Valid = torch.Tensor | None  # [b, s] True on real tokens of a padded batch (engines/masks.py)


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
    # the pp group is gloo carrying device tensors (host transport on GPUs): messages go
    # through host buffers
    staged: bool = False

    @property
    def first(self) -> bool:
        return self.pp_rank == 0

    @property
    def last(self) -> bool:
        return self.pp_rank == self.pp - 1


def stage_link(emu: Emu, global_rank: int, pp_group: Any, hidden_size: int,
               staged: bool = False) -> StageLink:
    """The link of ``global_rank`` in ``emu`` (``pp_group``: its pp group from ``unit_groups``;
    ``staged``: that group stages device tensors through host buffers)."""
    pp_rank, tp_rank = divmod(emu.gpus.index(global_rank), emu.layout.tp)
    pp = emu.layout.pp
    prev_rank = emu.gpu_at(pp_rank - 1, tp_rank) if pp_rank > 0 else None
    next_rank = emu.gpu_at(pp_rank + 1, tp_rank) if pp_rank < pp - 1 else None
    return StageLink(pp_rank, pp, prev_rank, next_rank, emu.gpu_at(pp - 1, tp_rank), pp_group,
                     hidden_size, staged)


def _positions(tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    return positions_of(valid, tokens.shape[0], tokens.shape[1], tokens.device)


def _mask(valid: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return attention_mask(None if valid is None else valid.to(device))


def _where(model: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    """The device of the stage and the dtype of its activations."""
    p = next(model.parameters())
    return p.device, p.dtype


def _recv(link: StageLink, src: int | None, shape: tuple[int, ...], tag: int,
          device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    if link.staged:
        host = torch.empty(shape, dtype=dtype)
        dist.recv(host, src=src, group=link.group, tag=tag)
        return host.to(device)
    buf = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(buf, src=src, group=link.group, tag=tag)
    return buf


def _isend(link: StageLink, t: torch.Tensor, dst: int | None, tag: int) -> Any:
    """Post a send; the returned work (or work and host copy) is waited for later."""
    out = t.detach().contiguous()
    if link.staged:
        out = out.cpu()
    return dist.isend(out, dst=dst, group=link.group, tag=tag), out


def _send(link: StageLink, t: torch.Tensor, dst: int | None, tag: int) -> None:
    work, _ = _isend(link, t, dst, tag)
    work.wait()


def _stage_out(model: torch.nn.Module, link: StageLink, tokens: torch.Tensor,
               received: torch.Tensor | None, valid: Valid = None) -> torch.Tensor:
    if not link.first:
        model.set_input_tensor(received)  # type: ignore[operator]
    valid = None if valid is None else valid.to(tokens.device)
    out: torch.Tensor = model(tokens, _positions(tokens, valid), _mask(valid, tokens.device))
    return out


def _act_shape(link: StageLink, tokens: torch.Tensor) -> tuple[int, int, int]:
    return tokens.shape[1], tokens.shape[0], link.hidden_size  # Megatron's [s, b, h]


def forward_logits(model: torch.nn.Module, link: StageLink, tp_group: Any,
                   tokens: torch.Tensor, valid: Valid = None) -> torch.Tensor | None:
    """Forward only (no grad): full-vocabulary logits [b, s, vocab] of ``tokens`` [b, s] (padded
    where ``valid`` is False) on the last stage, None on the others. Every rank of the unit
    calls it with the same tokens."""
    device, dtype = _where(model)
    tokens = tokens.to(device)
    with torch.no_grad():
        received = None
        if not link.first:
            received = _recv(link, link.prev_rank, _act_shape(link, tokens), 0, device, dtype)
        out = _stage_out(model, link, tokens, received, valid)
        if not link.last:
            _send(link, out, link.next_rank, 0)
            return None
        return full_vocab(model, out, tp_group)


def forward_cached(model: torch.nn.Module, link: StageLink, tokens: torch.Tensor,
                   positions: torch.Tensor, ctx: Any,
                   mask: torch.Tensor | None = None) -> torch.Tensor | None:
    """One KV-cache forward (prefill or decode) through the pipeline, no grad: the output layer's
    logits on the last stage (Megatron returns the last position only), None elsewhere. Each
    stage keeps the KV cache of its own layers in ``ctx``; ``mask``: the step's attention mask
    (:mod:`nereus.engines.masks`)."""
    device, dtype = _where(model)
    with torch.no_grad():
        if not link.first:
            received = _recv(link, link.prev_rank, _act_shape(link, tokens), 0, device, dtype)
            model.set_input_tensor(received)  # type: ignore[operator]
        out: torch.Tensor = model(tokens, positions, mask, inference_context=ctx,
                                  runtime_gather_output=True)
        if not link.last:
            _send(link, out, link.next_rank, 0)
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
    if link.staged:
        host = buf.cpu()
        dist.broadcast(host, src=link.last_rank, group=link.group)
        return host.to(buf.device)
    dist.broadcast(buf, src=link.last_rank, group=link.group)
    return buf


def forward_backward(model: torch.nn.Module, link: StageLink, tp_group: Any,
                     microbatches: Sequence[torch.Tensor], loss_fn: LossFn,
                     valid: Sequence[Valid] | None = None) -> float:
    """1F1B over ``microbatches`` (token tensors [b_i, s], padded where ``valid[i]`` is False);
    gradients accumulate in the model's ``.grad``. ``loss_fn(i, logits)`` runs on the last
    stage; returns the sum of its values there (0.0 on the other stages). On a GPU whose pp
    group is a device communicator, Megatron's own schedule runs
    (:func:`megatron_forward_backward`); elsewhere this CPU schedule."""
    device, dtype = _where(model)
    valid = list(valid) if valid is not None else [None] * len(microbatches)
    if device.type == "cuda" and not link.staged:
        return megatron_forward_backward(model, link, tp_group, microbatches, loss_fn, valid)
    microbatches = [m.to(device) for m in microbatches]
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
            received = _recv(link, link.prev_rank, _act_shape(link, tokens), 2 * i, device, dtype)
            received.requires_grad_(True)
        out = _stage_out(model, link, tokens, received, valid[i])
        inputs[i] = received
        if link.last:
            loss = loss_fn(i, full_vocab(model, out, tp_group))
            total += float(loss.detach())
            outputs[i] = loss
        else:
            sends.append(_isend(link, out, link.next_rank, 2 * i))
            outputs[i] = out

    def backward(i: int) -> None:
        out, received = outputs.pop(i), inputs.pop(i)
        if link.last:
            out.backward()
        else:
            grad = _recv(link, link.next_rank, tuple(out.shape), 2 * i + 1, device, out.dtype)
            out.backward(grad)
        if received is not None:
            if received.grad is None:
                raise RuntimeError(f"pipeline stage {link.pp_rank}: no input gradient")
            sends.append(_isend(link, received.grad, link.prev_rank, 2 * i + 1))

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
    for w, _ in sends:
        w.wait()
    return total


def megatron_forward_backward(model: torch.nn.Module, link: StageLink, tp_group: Any,
                              microbatches: Sequence[torch.Tensor], loss_fn: LossFn,
                              valid: Sequence[Valid] | None = None) -> float:
    """The same contract as :func:`forward_backward`, run by Megatron-core's schedules on a GPU
    (``forward_backward_no_pipelining`` at pp = 1, the non-interleaved 1F1B otherwise) with the
    unit's explicit groups. Megatron divides each microbatch's loss by the microbatch count;
    ours are already normalised, so the loss handed back is scaled up by it (equal gradients)."""
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.core.pipeline_parallel.schedules import (
        forward_backward_no_pipelining,
        forward_backward_pipelining_without_interleaving,
    )

    device, _ = _where(model)
    n = len(microbatches)
    if n == 0:
        return 0.0
    config: Any = model.config
    sizes = {int(m.shape[0]) for m in microbatches}
    config.variable_seq_lengths = len(sizes) > 1  # the last microbatch may be shorter
    pgs: Any = model.pg_collection

    masks = list(valid) if valid is not None else [None] * n

    def forward_step(data_iterator: Any, stage: torch.nn.Module) -> tuple[torch.Tensor, Any]:
        i, tokens = next(data_iterator)
        tokens = tokens.to(device)
        mb_valid = masks[i]
        v = None if mb_valid is None else mb_valid.to(device)
        out: torch.Tensor = stage(tokens, _positions(tokens, v), _mask(v, device))

        def loss_func(output: torch.Tensor, i: int = i) -> tuple[torch.Tensor, dict[str, Any]]:
            loss = loss_fn(i, full_vocab(model, output, tp_group))
            return loss * n, {"loss": loss.detach()}

        return out, loss_func

    kwargs: dict[str, Any] = dict(
        forward_step_func=forward_step, data_iterator=iter(enumerate(microbatches)),
        model=[model], num_microbatches=n, seq_length=int(microbatches[0].shape[1]),
        micro_batch_size=int(microbatches[0].shape[0]), forward_only=False, pg_collection=pgs)
    if link.pp == 1:
        store = forward_backward_no_pipelining(**kwargs)
    else:
        store = forward_backward_pipelining_without_interleaving(
            **kwargs, p2p_communicator=P2PCommunicator(pp_group=link.group, config=config))
    return float(sum(float(d["loss"]) for d in store)) if link.last else 0.0
