"""Shared cases for the shard pack/unpack tests (CPU fallback, host-mode kernels, GPU kernels).

Random pieces are boxes on random tensors (1-4 dims, several dtypes, some transposed so they are
not contiguous). Checks compare bytes, so NaN payloads compare equal to themselves. Needs only
torch and the standard library (the GPU check runs where hypothesis may be missing).
"""

from __future__ import annotations

import itertools
import random

import torch

DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.int8, torch.float64)
# Every output is filled with each poison in turn: a byte never written cannot match both times.
POISONS = (0x00, 0xFF)

Box = tuple[tuple[int, int], ...]


def poison(t: torch.Tensor, byte: int) -> None:
    """Sets every byte of ``t``'s storage to ``byte``."""
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
    raw.fill_(byte)


def tensor_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` in row-major order of its (logical) elements."""
    c = t.contiguous()
    return c.as_strided((c.numel(),), (1,)).view(torch.uint8)


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int, device: str = "cpu") -> torch.Tensor:
    """Random bytes viewed as ``dtype`` (any bit pattern, NaNs included)."""
    es = torch.empty(0, dtype=dtype).element_size()
    n = es
    for d in shape:
        n *= d
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape).to(device)


def region(box: Box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)


def reference_pack(pieces: list[tuple[torch.Tensor, Box]]) -> torch.Tensor:
    """The packed bytes by torch's own slicing: each piece's bytes, back to back."""
    parts = [tensor_bytes(t[region(box)]) for t, box in pieces]
    if not parts:
        return torch.empty(0, dtype=torch.uint8)
    return torch.cat(parts)


def expected_after_unpack(
    dest: torch.Tensor, byte: int, buffer: torch.Tensor, targets: list[tuple[torch.Tensor, Box]]
) -> torch.Tensor:
    """What ``dest`` holds after unpacking ``buffer`` into disjoint ``targets`` when it started
    as all ``byte``: the poison, with each target's bytes on it."""
    expect = torch.empty_strided(dest.shape, dest.stride(), dtype=dest.dtype, device=dest.device)
    poison(expect, byte)
    off = 0
    for t, box in targets:
        view = t[region(box)]
        n = view.numel() * view.element_size()
        if t is dest:
            expect[region(box)].copy_(buffer[off : off + n].clone().view(t.dtype).view(view.shape))
        off += n
    return expect


def _random_box(rng: random.Random, shape: tuple[int, ...]) -> Box:
    """Mostly non-empty boxes: a full range a third of the time (so dims merge), rarely empty."""
    box = []
    for n in shape:
        u = rng.random()
        if u < 0.05:
            a = rng.randint(0, n)
            box.append((a, a))
        elif u < 0.35:
            box.append((0, n))
        else:
            a = rng.randint(0, n - 1)
            box.append((a, rng.randint(a + 1, n)))
    return tuple(box)


def random_pieces(
    rng: random.Random,
    device: str = "cpu",
    max_dim: int = 7,
    max_pieces: int = 6,
    disjoint: bool = False,
) -> list[tuple[torch.Tensor, Box]]:
    """1-3 random tensors and random boxes on them (about ``max_pieces``). ``disjoint``: boxes of
    one tensor do not overlap (cut along one axis), as unpack destinations must not."""
    tensors = []
    for _ in range(rng.randint(1, 3)):
        ndim = rng.randint(1, 4)
        shape = tuple(rng.randint(1, max_dim) for _ in range(ndim))
        if rng.random() < 0.3:  # one long dim: rows longer than a small tile
            axis = rng.randrange(ndim)
            shape = shape[:axis] + (rng.randint(1, 8 * max_dim * max_dim),) + shape[axis + 1 :]
        t = random_tensor(shape, rng.choice(DTYPES), rng.randrange(1 << 30), device)
        if ndim >= 2 and rng.random() < 0.5:
            t = t.transpose(0, ndim - 1)
        tensors.append(t)
    pieces: list[tuple[torch.Tensor, Box]] = []
    if not disjoint:
        for _ in range(rng.randint(1, max_pieces)):
            t = rng.choice(tensors)
            pieces.append((t, _random_box(rng, tuple(t.shape))))
        return pieces
    for t in tensors:
        shape = tuple(t.shape)
        axis = rng.randrange(len(shape))
        cuts = sorted({0, shape[axis], *(rng.randint(0, shape[axis]) for _ in range(2))})
        for a, b in itertools.pairwise(cuts):
            if rng.random() < 0.8:
                box = list(_random_box(rng, shape))
                box[axis] = (a, b)
                pieces.append((t, tuple(box)))
    rng.shuffle(pieces)
    return pieces


def fresh_like(pieces: list[tuple[torch.Tensor, Box]], byte: int) -> list[tuple[torch.Tensor, Box]]:
    """The same boxes on new poisoned tensors of the same shapes, strides and dtypes."""
    dests: dict[int, torch.Tensor] = {}
    out = []
    for t, box in pieces:
        if id(t) not in dests:
            d = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            poison(d, byte)
            dests[id(t)] = d
        out.append((dests[id(t)], box))
    return out


def check_pack(pieces: list[tuple[torch.Tensor, Box]], shift: int = 0, **kw: object) -> None:
    """pack() into poisoned buffers (starting ``shift`` bytes into an allocation) equals torch's
    slicing, byte for byte."""
    from nereus.kernels.pack import pack, packed_nbytes

    device = pieces[0][0].device if pieces else torch.device("cpu")
    ref = reference_pack(pieces).to(device)
    assert packed_nbytes(pieces) == ref.numel()
    for byte in POISONS:
        whole = torch.empty(ref.numel() + shift, dtype=torch.uint8, device=device)
        whole.fill_(byte)
        out = whole[shift:]
        got = pack(pieces, out=out, **kw)  # type: ignore[arg-type]
        assert got is out
        assert torch.equal(out, ref), f"pack differs at {(out != ref).nonzero()[:8].tolist()}"
        assert torch.all(whole[:shift] == byte)


def check_unpack(pieces: list[tuple[torch.Tensor, Box]], shift: int = 0, **kw: object) -> None:
    """unpack() of torch's packed bytes into poisoned tensors writes exactly the (disjoint)
    boxes and nothing else."""
    from nereus.kernels.pack import unpack

    device = pieces[0][0].device if pieces else torch.device("cpu")
    ref = reference_pack(pieces).to(device)
    whole = torch.empty(ref.numel() + shift, dtype=torch.uint8, device=device)
    whole[shift:] = ref
    buffer = whole[shift:]
    for byte in POISONS:
        targets = fresh_like(pieces, byte)
        unpack(buffer, targets, **kw)  # type: ignore[arg-type]
        seen: set[int] = set()
        for dest, _ in targets:
            if id(dest) in seen:
                continue
            seen.add(id(dest))
            expect = expected_after_unpack(dest, byte, buffer, targets)
            assert torch.equal(tensor_bytes(dest), tensor_bytes(expect))


def check_roundtrip(pieces: list[tuple[torch.Tensor, Box]], **kw: object) -> None:
    """unpack(pack(x)) into poisoned copies restores the (disjoint) boxes and only them."""
    from nereus.kernels.pack import pack, unpack

    buffer = pack(pieces, **kw)  # type: ignore[arg-type]
    targets = fresh_like(pieces, 0xFF)
    unpack(buffer, targets, **kw)  # type: ignore[arg-type]
    for (src, box), (dest, _) in zip(pieces, targets, strict=True):
        assert torch.equal(tensor_bytes(dest[region(box)]), tensor_bytes(src[region(box)]))
