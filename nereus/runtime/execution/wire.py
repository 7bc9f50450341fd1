"""Posting one pass of point-to-point messages on a transition group, whatever its transport
(effectful).

The executor says what goes where — :meth:`Wire.send` a tensor to a peer, :meth:`Wire.recv` into
a tensor (or a buffer handed to a callback) from a peer — and waits for what :meth:`Wire.post`
returns. How the bytes travel is the group's business:

- ``host``, host tensors (CPU ranks): gloo's send/recv on the tensors themselves — a contiguous
  destination receives in place, any other through a buffer copied afterwards;
- ``host``, staged (device tensors: ranks sharing a GPU, ranks of different vendors): each
  message is copied into a pinned host buffer and sent over gloo; a receive lands in a pinned
  host buffer and is copied onto the device when it completes;
- ``device`` (NCCL, RCCL): every send and receive of the pass is posted as one batch
  (``batch_isend_irecv``: NCCL groups them, so no pair waits on the order of the other's posts),
  host tensors (the counters) travelling on the device; messages of one pair in one direction
  match in the order they are posted, as the tags say on gloo.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from nereus.cluster.transport import DEVICE
from nereus.runtime.execution.groups import TransitionGroup

# (what, peer, work, called after the work completed or None, timeout) — the executor's waits
Posted = tuple[str, int, Any, Callable[[], None] | None, float]


def _host_buffer(like: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype
                 ) -> torch.Tensor:
    """A host buffer, pinned when a device is there to copy from or to."""
    pin = torch.cuda.is_available() and like is not None and like.device.type != "cpu"
    return torch.empty(shape, dtype=dtype, pin_memory=pin)


def _copy_then(dst: torch.Tensor, src: torch.Tensor, then: Callable[[], None] | None) -> None:
    dst.copy_(src)
    if then is not None:
        then()


class Wire:
    """The messages of one pass on ``group`` (this rank is ``global_rank``)."""

    def __init__(self, group: TransitionGroup, global_rank: int) -> None:
        self.group = group
        self.global_rank = global_rank
        self.keep: list[torch.Tensor] = []  # host buffers that must outlive their work
        self._posted: list[Posted] = []
        self._ops: list[Any] = []  # device transport: P2POps of the batch
        self._after: list[Callable[[], None]] = []  # device transport: run after the batch
        self.staged_bytes = 0  # bytes copied through host buffers (staged host transport)

    @property
    def device_transport(self) -> bool:
        return self.group.transport == DEVICE

    def _wire_device(self) -> torch.device:
        """Where a message's bytes must be for the transport."""
        if self.device_transport:
            assert self.group.device is not None
            return self.group.device
        return torch.device("cpu")

    def send(self, tensor: torch.Tensor, peer: int, tag: int, what: str = "send to") -> None:
        """Send ``tensor`` (contiguous) to global rank ``peer``."""
        wire = self._wire_device()
        out = tensor
        if tensor.device != wire or (self.group.staged and not self.device_transport):
            out = _host_buffer(tensor, tuple(tensor.shape), tensor.dtype) if \
                wire.type == "cpu" else torch.empty_like(tensor, device=wire)
            out.copy_(tensor)
            if wire.type == "cpu":
                self.staged_bytes += out.numel() * out.element_size()
        self.keep.append(out)
        if self.device_transport:
            self._ops.append(dist.P2POp(dist.isend, out, peer, self.group.pg, tag))
            return
        dest = self.group.group_rank(peer)
        self._posted.append((what, peer, self.group.pg.send([out], dest, tag), None,
                             self.group.timeout_s))

    def recv(self, into: torch.Tensor, peer: int, tag: int, what: str = "recv from",
             then: Callable[[], None] | None = None) -> None:
        """Receive from global rank ``peer`` into ``into`` (any strides, any device); ``then``
        runs once its bytes are there."""
        wire = self._wire_device()
        direct = into.device == wire and into.is_contiguous() and not (
            self.group.staged and not self.device_transport)
        if direct:
            land = into
            after = then
        else:
            land = _host_buffer(into, tuple(into.shape), into.dtype) if wire.type == "cpu" \
                else torch.empty(tuple(into.shape), dtype=into.dtype, device=wire)
            self.keep.append(land)
            if wire.type == "cpu" and (self.group.staged or into.device.type != "cpu"):
                self.staged_bytes += land.numel() * land.element_size()
            after = functools.partial(_copy_then, into, land, then)
        if self.device_transport:
            self._ops.append(dist.P2POp(dist.irecv, land, peer, self.group.pg, tag))
            if after is not None:
                self._after.append(after)
            return
        src = self.group.group_rank(peer)
        self._posted.append((what, peer, self.group.pg.recv([land], src, tag), after,
                             self.group.timeout_s))

    def recv_buffer(self, numel: int, dtype: torch.dtype, device: torch.device, peer: int,
                    tag: int, then: Callable[[torch.Tensor], None], what: str = "recv from"
                    ) -> None:
        """Receive ``numel`` values from ``peer`` into a new buffer on ``device`` and hand it to
        ``then`` once complete (a packed message: ``then`` unpacks it where the views are)."""
        buf = torch.empty(numel, dtype=dtype, device=device)
        self.recv(buf, peer, tag, what, functools.partial(then, buf))

    def post(self) -> list[Posted]:
        """Everything posted, in the order to wait for (device transport: the batch now)."""
        if self._ops:
            works = dist.batch_isend_irecv(self._ops)
            after = list(self._after)

            def run_after() -> None:
                for fn in after:
                    fn()

            peers = sorted({op.peer for op in self._ops})
            label = f"{len(self._ops)} transfers with ranks {peers} over {self.group.label}"
            for i, w in enumerate(works):
                last = i == len(works) - 1
                self._posted.append((label, -1, w, run_after if last else None,
                                     self.group.timeout_s))
            self._ops, self._after = [], []
        out, self._posted = self._posted, []
        return out


def post_all_gather(group: TransitionGroup, mine: torch.Tensor, out_numel: int,
                    then: Callable[[torch.Tensor], None], what: str,
                    keep: list[torch.Tensor]) -> Posted:
    """Post this member's all-gather of ``mine`` into a buffer of ``out_numel`` values on the
    members of ``group``; ``then`` gets the gathered buffer (on ``mine``'s device)."""
    if group.transport == DEVICE:
        out = torch.empty(out_numel, dtype=mine.dtype, device=mine.device)
        work = dist.all_gather_into_tensor(out, mine.contiguous(), group=group.pg, async_op=True)
        return (what, -1, work, functools.partial(then, out), group.timeout_s)
    if mine.device.type != "cpu" or group.staged:
        host_mine = _host_buffer(mine, tuple(mine.shape), mine.dtype)
        host_mine.copy_(mine)
        host_out = _host_buffer(mine, (out_numel,), mine.dtype)
        keep += [host_mine, host_out]
        work = group.pg._allgather_base(host_out, host_mine)

        def back() -> None:
            then(host_out.to(mine.device))

        return (what, -1, work, back, group.timeout_s)
    out = torch.empty(out_numel, dtype=mine.dtype)
    work = group.pg._allgather_base(out, mine)
    return (what, -1, work, functools.partial(then, out), group.timeout_s)
