"""Which code packs and unpacks a transfer's slices: the compiled kernels or torch (effectful).

Chosen once per process (:func:`process_packer`): on a GPU rank the compiled extension
``nereus._kernels`` (``kernels/cuda`` or ``kernels/hip``, built by ``setup.py`` when a toolkit is
present) packs every slice of a message in one launch; without it — and on CPU ranks — the torch
fallback (:mod:`nereus.runtime.execution.pack`) copies slice by slice. A :class:`Packer` built
from the kernels' host mode (:mod:`nereus.kernels.host_mode`) runs the same device code on CPU
tensors: the CPU tests drive the executor through it. Every packer keeps the order of ``views``
and fills the same bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nereus.errors import TransitionError
from nereus.runtime.execution import pack as torch_pack

TORCH = "torch"


@dataclass(frozen=True)
class Packer:
    """``name``: ``torch``, ``kernels:cuda``, ``kernels:hip`` or ``kernels:host``; ``launch``:
    the host mode's table launch (None: the compiled extension, or torch)."""

    name: str
    launch: Any = None

    @property
    def kernels(self) -> bool:
        return self.name != TORCH

    def pack(self, views: Sequence[torch.Tensor], length: int | None = None) -> torch.Tensor:
        """One flat buffer holding ``views`` one after another (C order each), zero-padded to
        ``length`` values when given."""
        if not self.kernels or not views:
            return torch_pack.pack(views, length)
        from nereus.kernels.pack import pack_views

        dtype, device = _common(views)
        total = sum(v.numel() for v in views)
        if length is not None and length < total:
            raise ValueError(f"pack: {total} values do not fit a buffer of {length}")
        out = torch.empty(total if length is None else length, dtype=dtype, device=device)
        if total:
            pack_views(views, out=out[:total], launch=self.launch,
                       force_backend=None if self.launch is not None else "kernels")
        out[total:].zero_()
        return out

    def unpack(self, buffer: torch.Tensor, views: Sequence[torch.Tensor]) -> None:
        """Copy consecutive parts of ``buffer`` into ``views`` (writable views of the
        targets); the buffer holds exactly their values."""
        if not self.kernels or not views:
            torch_pack.unpack(buffer, views)
            return
        from nereus.kernels.pack import unpack_views

        _common(views)
        total = sum(v.numel() for v in views)
        if total != buffer.numel():
            raise ValueError(f"unpack: buffer of {buffer.numel()} values for views of {total}")
        if total:
            unpack_views(buffer, views, launch=self.launch,
                         force_backend=None if self.launch is not None else "kernels")


def _common(views: Sequence[torch.Tensor]) -> tuple[torch.dtype, torch.device]:
    dtypes = {v.dtype for v in views}
    devices = {v.device for v in views}
    if len(dtypes) != 1 or len(devices) != 1:
        raise TransitionError(f"pack: one message holds one dtype on one device, got "
                              f"{sorted(map(str, dtypes))} on {sorted(map(str, devices))}")
    return next(iter(dtypes)), next(iter(devices))


TORCH_PACKER = Packer(TORCH)


def host_mode_packer(lib_dir: str | None = None, threads: int = 256) -> Packer:
    """The kernels' host mode as a packer (builds it once with the system C++ compiler)."""
    from nereus.kernels.host_mode import build_host_library, host_launch, load_host_library

    return Packer("kernels:host", host_launch(load_host_library(build_host_library(lib_dir)),
                                              threads))


def extension_dialect() -> str | None:
    """``cuda`` or ``hip`` when ``nereus._kernels`` is built, else None."""
    from nereus.kernels.pack import kernels_available

    if not kernels_available():
        return None
    import importlib

    return str(getattr(importlib.import_module("nereus._kernels"), "DIALECT", "cuda")).lower()


@functools.cache
def process_packer(device_type: str) -> Packer:
    """The packer of this process for tensors on ``device_type`` (``cpu`` or ``cuda``):
    the compiled kernels on a GPU when built, else torch. Decided once per process."""
    if device_type == "cuda":
        dialect = extension_dialect()
        if dialect is not None:
            return Packer(f"kernels:{dialect}")
    return TORCH_PACKER


def describe_pack_path() -> str:
    """One line for ``nereus inventory``: what packs transfers on this machine's GPUs."""
    dialect = extension_dialect()
    if dialect is None:
        return ("torch fallback (nereus._kernels is not built: setup.py builds it where a CUDA "
                "or ROCm toolkit is present)")
    return f"nereus._kernels ({dialect} build) on GPU ranks; torch on CPU ranks"
