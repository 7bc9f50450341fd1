"""Shard pack and unpack: many strided slices <-> one contiguous transfer buffer.

How a transfer uses it (the EMU transfer plans and the runtime's executor)::

    from nereus.kernels.pack import pack, packed_nbytes, unpack

    # sender: every piece it sends to one peer, in the plan's order
    send_pieces = [(qkv_weight, ((0, 1536), (0, 4096))), (proj_weight, ((0, 4096), (0, 1024)))]
    buf = pack(send_pieces)                         # one contiguous buffer, one launch on GPU
    dist.send(buf, dst=peer_rank, group=group)
    # receiver: the same pieces, in the same order, as boxes of its own tensors
    buf = torch.empty(packed_nbytes(recv_pieces), dtype=torch.uint8, device=dev)
    dist.recv(buf, src=peer_rank, group=group)
    unpack(buf, recv_pieces)                        # scatter into the destination views

A piece is ``(tensor, box)``; a box is ((start, stop), ...) per dim, or any object with ``start``
and ``stop`` tuples (``nereus.emu.boxes.Box``). Code that already holds the slices as tensor
views uses ``pack_views(views)`` / ``unpack_views(buffer, views)`` (the same signatures as the
runtime's plain-torch pack hook). The lower-level form is ``pack(tensors, slices)`` with
``SliceSpec``s (``slice_spec`` converts a box). The buffer holds the slices back to back
in the given order, each in row-major order of its sizes, with no padding, so both ends only
have to agree on the order and shapes. A pack returns a buffer of the tensors' common dtype
(uint8 when they differ); ``out=`` and unpack's buffer may be any contiguous tensor of exactly
``packed_nbytes`` bytes.

Backends, chosen per call by ``backend(device)``: the compiled extension ``nereus._kernels``
(the CUDA or HIP build of ``kernels/``, see setup.py) for GPU tensors when it was built — one
launch for all slices plus one small descriptor-table upload (cached per table content); else
the torch fallback, one ``copy_`` per slice into views of one preallocated buffer. Both run on
the current stream. Slices the kernels cannot index (more than 3 outer dims after merging, or
2^31 rows or more) are copied by the fallback within the same call. Overlapping destination
slices in ``unpack`` give an unspecified result.
"""

from __future__ import annotations

import functools
import importlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, overload

import numpy as np
import torch

from nereus.errors import TransitionError
from nereus.kernels import table as desc_table
from nereus.kernels.slices import SliceSpec, box_spec, check_inside, row_geometry

Piece = tuple[torch.Tensor, Any]
# Runs one launch of the kernels over a descriptor table: (table, n_tiles, to_tensors).
TableLaunch = Callable[[np.ndarray, int, bool], None]

KERNELS = "kernels"
TORCH = "torch"
_TABLE_CACHE_ENTRIES = 64
# Device copies of descriptor tables, keyed by (device, stream, table bytes): a table names
# absolute addresses, so equal bytes mean the same copy; an entry is only read by the kernels.
_device_tables: OrderedDict[tuple[str, int, bytes], torch.Tensor] = OrderedDict()


@functools.cache
def _extension() -> ModuleType | None:
    """The compiled ``nereus._kernels``, imported once; None when it was not built."""
    try:
        ext = importlib.import_module("nereus._kernels")
    except ImportError:
        return None
    if (ext.LAYOUT_VERSION, ext.DESC_FIELDS) != (desc_table.LAYOUT_VERSION, desc_table.DESC_FIELDS):
        raise TransitionError(
            f"nereus._kernels has descriptor layout {ext.LAYOUT_VERSION}/{ext.DESC_FIELDS}, "
            f"this package {desc_table.LAYOUT_VERSION}/{desc_table.DESC_FIELDS}: rebuild it"
        )
    return ext


def kernels_available() -> bool:
    """True when the compiled extension is importable."""
    return _extension() is not None


def backend(device: torch.device) -> str:
    """``"kernels"`` for GPU tensors when ``nereus._kernels`` was built, else ``"torch"``."""
    return KERNELS if device.type == "cuda" and kernels_available() else TORCH


def slice_spec(tensor_index: int, tensor: torch.Tensor, box: Any) -> SliceSpec:
    """The ``SliceSpec`` of ``box`` ((start, stop) per dim, or a Box) on ``tensor``."""
    return box_spec(tensor_index, tuple(tensor.shape), tuple(tensor.stride()), box)


def specs_of_pieces(pieces: Sequence[Piece]) -> tuple[list[torch.Tensor], list[SliceSpec]]:
    """(tensors, slices) for ``pack(tensors, slices)`` from (tensor, box) pieces."""
    for i, piece in enumerate(pieces):
        if not (isinstance(piece, tuple) and len(piece) == 2 and isinstance(piece[0], torch.Tensor)):
            raise TransitionError(f"piece {i}: needs (tensor, box), got {type(piece).__name__}")
    tensors = [t for t, _ in pieces]
    return tensors, [slice_spec(i, t, box) for i, (t, box) in enumerate(pieces)]


def _normalize(
    tensors: Sequence[Any], slices: Sequence[SliceSpec] | None
) -> tuple[list[torch.Tensor], list[SliceSpec]]:
    if slices is None:
        return specs_of_pieces(tensors)
    ts = list(tensors)
    specs = list(slices)
    for spec in specs:
        if spec.tensor >= len(ts):
            raise TransitionError(f"slice {spec}: tensor index past the {len(ts)} tensors")
        t = ts[spec.tensor]
        check_inside(spec, tuple(t.shape), tuple(t.stride()))
    return ts, specs


def _offsets(tensors: list[torch.Tensor], specs: list[SliceSpec]) -> tuple[list[int], int]:
    offsets: list[int] = []
    total = 0
    for spec in specs:
        offsets.append(total)
        total += spec.numel * tensors[spec.tensor].element_size()
    return offsets, total


@overload
def packed_nbytes(tensors: Sequence[Piece], slices: None = None) -> int: ...
@overload
def packed_nbytes(tensors: Sequence[torch.Tensor], slices: Sequence[SliceSpec]) -> int: ...
def packed_nbytes(tensors: Sequence[Any], slices: Sequence[SliceSpec] | None = None) -> int:
    """Bytes of the buffer that ``pack`` fills for these slices (or pieces)."""
    ts, specs = _normalize(tensors, slices)
    return _offsets(ts, specs)[1]


def _device_of(tensors: list[torch.Tensor], specs: list[SliceSpec]) -> torch.device | None:
    devices = {tensors[s.tensor].device for s in specs}
    if len(devices) > 1:
        raise TransitionError(f"slices of tensors on several devices: {sorted(map(str, devices))}")
    return next(iter(devices)) if devices else None


def _byte_view(buffer: torch.Tensor, nbytes: int, device: torch.device | None, what: str) -> torch.Tensor:
    if not buffer.is_contiguous():
        raise TransitionError(f"{what}: needs a contiguous tensor")
    have = buffer.numel() * buffer.element_size()
    if have != nbytes:
        raise TransitionError(f"{what}: has {have} bytes, the slices need {nbytes}")
    if device is not None and buffer.device != device:
        raise TransitionError(f"{what}: on {buffer.device}, the tensors on {device}")
    # as_strided: a one-element tensor may be contiguous with a stride other than 1
    return buffer.as_strided((buffer.numel(),), (1,)).view(torch.uint8)


def _views(
    t: torch.Tensor, spec: SliceSpec, flat: torch.Tensor, off: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the slice as a view of its tensor, its bytes in the packed buffer as a matching view)."""
    es = t.element_size()
    n = spec.numel * es
    if (flat.storage_offset() + off) % es == 0:
        strided = t.as_strided(spec.sizes, spec.strides, t.storage_offset() + spec.offset)
        return strided, flat[off : off + n].view(t.dtype).view(spec.sizes)
    # Unaligned for this dtype (mixed dtypes in one buffer): copy the same bytes as uint8.
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
    strided = raw.as_strided(
        (*spec.sizes, es),
        (*(s * es for s in spec.strides), 1),
        (t.storage_offset() + spec.offset) * es,
    )
    return strided, flat[off : off + n].view((*spec.sizes, es))


def _fallback(
    tensors: list[torch.Tensor],
    specs: list[SliceSpec],
    offsets: list[int],
    flat: torch.Tensor,
    to_tensors: bool,
) -> None:
    with torch.no_grad():
        for spec, off in zip(specs, offsets, strict=True):
            if spec.numel == 0:
                continue
            strided, packed = _views(tensors[spec.tensor], spec, flat, off)
            if to_tensors:
                strided.copy_(packed)
            else:
                packed.copy_(strided)


def _device_table(table: np.ndarray, device: torch.device) -> torch.Tensor:
    stream = torch.cuda.current_stream(device)
    key = (str(device), int(stream.cuda_stream), table.tobytes())
    hit = _device_tables.get(key)
    if hit is not None:
        _device_tables.move_to_end(key)
        return hit
    host = torch.from_numpy(table).pin_memory()
    dev = host.to(device, non_blocking=True)
    _device_tables[key] = dev
    while len(_device_tables) > _TABLE_CACHE_ENTRIES:
        _device_tables.popitem(last=False)
    return dev


def _gpu_launch(ext: ModuleType, device: torch.device) -> TableLaunch:
    def launch(table: np.ndarray, n_tiles: int, to_tensors: bool) -> None:
        with torch.cuda.device(device):
            desc = _device_table(table, device)
            stream = int(torch.cuda.current_stream(device).cuda_stream)
            (ext.unpack if to_tensors else ext.pack)(desc, n_tiles, stream)

    return launch


def _table_copy(
    launch: TableLaunch,
    tensors: list[torch.Tensor],
    specs: list[SliceSpec],
    offsets: list[int],
    flat: torch.Tensor,
    to_tensors: bool,
    tile_bytes: int,
) -> None:
    """One launch for every slice the kernels can index; the fallback for the rest."""
    copies: list[desc_table.Copy] = []
    rest_specs: list[SliceSpec] = []
    rest_offsets: list[int] = []
    base = flat.data_ptr()
    for spec, off in zip(specs, offsets, strict=True):
        if spec.numel == 0:
            continue
        t = tensors[spec.tensor]
        geometry = row_geometry(spec, t.element_size())
        if geometry is None or not desc_table.fits(geometry):
            rest_specs.append(spec)
            rest_offsets.append(off)
            continue
        copies.append(desc_table.Copy(t.data_ptr() + geometry.offset_bytes, base + off, geometry))
    if copies:
        table, n_tiles = desc_table.build_table(copies, tile_bytes)
        launch(table, n_tiles, to_tensors)
    if rest_specs:
        _fallback(tensors, rest_specs, rest_offsets, flat, to_tensors)


def _run(
    tensors: list[torch.Tensor],
    specs: list[SliceSpec],
    offsets: list[int],
    flat: torch.Tensor,
    to_tensors: bool,
    force_backend: str | None,
    tile_bytes: int,
    launch: TableLaunch | None,
) -> None:
    if launch is not None:
        _table_copy(launch, tensors, specs, offsets, flat, to_tensors, tile_bytes)
        return
    chosen = backend(flat.device) if force_backend is None else force_backend
    if chosen == KERNELS:
        ext = _extension()
        if ext is None or flat.device.type != "cuda":
            raise TransitionError(f"backend 'kernels' for tensors on {flat.device}: not available")
        _table_copy(_gpu_launch(ext, flat.device), tensors, specs, offsets, flat, to_tensors, tile_bytes)
    elif chosen == TORCH:
        _fallback(tensors, specs, offsets, flat, to_tensors)
    else:
        raise TransitionError(f"backend {chosen!r}: not one of {KERNELS!r}, {TORCH!r}")


@overload
def pack(
    tensors: Sequence[Piece],
    slices: None = None,
    out: torch.Tensor | None = None,
    *,
    force_backend: str | None = None,
    tile_bytes: int = desc_table.DEFAULT_TILE_BYTES,
    launch: TableLaunch | None = None,
) -> torch.Tensor: ...
@overload
def pack(
    tensors: Sequence[torch.Tensor],
    slices: Sequence[SliceSpec],
    out: torch.Tensor | None = None,
    *,
    force_backend: str | None = None,
    tile_bytes: int = desc_table.DEFAULT_TILE_BYTES,
    launch: TableLaunch | None = None,
) -> torch.Tensor: ...
def pack(
    tensors: Sequence[Any],
    slices: Sequence[SliceSpec] | None = None,
    out: torch.Tensor | None = None,
    *,
    force_backend: str | None = None,
    tile_bytes: int = desc_table.DEFAULT_TILE_BYTES,
    launch: TableLaunch | None = None,
) -> torch.Tensor:
    """Gathers the slices (or (tensor, box) pieces) into one contiguous buffer, returned.

    ``out``: a contiguous tensor of exactly ``packed_nbytes`` bytes to fill instead of a new
    one. ``force_backend``: ``"kernels"`` or ``"torch"`` instead of ``backend(device)``.
    ``tile_bytes``: the kernels' work unit. ``launch``: run the kernels' descriptor table
    through this instead (the CPU tests pass the host mode of the kernels).
    """
    ts, specs = _normalize(tensors, slices)
    offsets, total = _offsets(ts, specs)
    device = _device_of(ts, specs)
    if out is None:
        dtypes = {ts[s.tensor].dtype for s in specs}
        dtype = dtypes.pop() if len(dtypes) == 1 else torch.uint8
        es = torch.empty(0, dtype=dtype).element_size()
        out = torch.empty(total // es, dtype=dtype, device=device or torch.device("cpu"))
    flat = _byte_view(out, total, device, "pack out=")
    _run(ts, specs, offsets, flat, False, force_backend, tile_bytes, launch)
    return out


@overload
def unpack(
    buffer: torch.Tensor,
    tensors: Sequence[Piece],
    slices: None = None,
    *,
    force_backend: str | None = None,
    tile_bytes: int = desc_table.DEFAULT_TILE_BYTES,
    launch: TableLaunch | None = None,
) -> None: ...
@overload
def unpack(
    buffer: torch.Tensor,
    tensors: Sequence[torch.Tensor],
    slices: Sequence[SliceSpec],
    *,
    force_backend: str | None = None,
    tile_bytes: int = desc_table.DEFAULT_TILE_BYTES,
    launch: TableLaunch | None = None,
) -> None: ...
def unpack(
    buffer: torch.Tensor,
    tensors: Sequence[Any],
    slices: Sequence[SliceSpec] | None = None,
    *,
    force_backend: str | None = None,
    tile_bytes: int = desc_table.DEFAULT_TILE_BYTES,
    launch: TableLaunch | None = None,
) -> None:
    """Scatters a packed buffer into the slices (or pieces): the inverse of ``pack``."""
    ts, specs = _normalize(tensors, slices)
    offsets, total = _offsets(ts, specs)
    device = _device_of(ts, specs)
    flat = _byte_view(buffer, total, device, "unpack buffer")
    _run(ts, specs, offsets, flat, True, force_backend, tile_bytes, launch)


def _view_specs(views: Sequence[torch.Tensor]) -> list[SliceSpec]:
    return [SliceSpec(i, 0, tuple(v.stride()), tuple(v.shape)) for i, v in enumerate(views)]


def pack_views(views: Sequence[torch.Tensor], out: torch.Tensor | None = None, *,
               force_backend: str | None = None, launch: TableLaunch | None = None
               ) -> torch.Tensor:
    """``pack`` of whole tensor views (any strides), one after another in C order each."""
    return pack(list(views), _view_specs(views), out, force_backend=force_backend, launch=launch)


def unpack_views(buffer: torch.Tensor, views: Sequence[torch.Tensor], *,
                 force_backend: str | None = None, launch: TableLaunch | None = None) -> None:
    """``unpack`` into whole writable tensor views: consecutive parts of ``buffer`` in order."""
    unpack(buffer, list(views), _view_specs(views), force_backend=force_backend, launch=launch)
