"""Framed control-plane messages: plain data over buffer-based MPI calls, checked, then agreed.

Nothing a rank receives on the control plane is unpickled. A message is plain data — dicts with
string keys, lists (tuples travel as lists), strings, numbers, booleans, None — and numpy arrays
(not of object dtype). It travels as one *frame*:

- a **prefix** of :data:`PREFIX_BYTES`: magic ``NRFM``, the format version, the channel (a
  16-bit code of the message kind, so a rank expecting a ``plan`` never decodes a ``replica``),
  the header and body lengths, the blake2b-256 digest of all of it, and a blake2b-64 check of the
  prefix's own fields (a torn prefix is never trusted for a length);
- a **payload**: the header — UTF-8 JSON of the structure, each array replaced by
  ``{"__nereus_array__": i}``, plus ``[dtype, shape, offset]`` of every array — followed by the
  **body**, the arrays' raw bytes (8-byte aligned).

:func:`bcast` sends the prefix with one ``MPI_Bcast`` and the payload with more (segments of
:data:`SEGMENT_BYTES`); :func:`allgather` sends every rank's prefix with ``MPI_Allgather`` and the
payloads with one ``MPI_Allgatherv``. Every receiver checks magic, version, channel, lengths and
digest and decodes; then **every rank agrees on the digest** (:func:`agree_digest`: one
``MPI_Allreduce`` of the digest words and their negatives with ``MIN``, i.e. the minimum and the
maximum of every word) before anyone acts on the message. A rank completes the agreement only
with every rank's contribution, so a rank that returns from :func:`bcast` knows that every rank
of the communicator holds the same complete message.

A short, torn, zero-filled or mismatched frame raises :class:`FrameError`, a
:class:`~nereus.errors.CommunicationError`: like an MPI error from a dead peer it is survivable
(:func:`nereus.runtime.failures.ulfm.secondary`), so the rank revokes and shrinks the
communicator and the survivors recover from surviving replicas, exactly as after an MPI error.
A rank that finds its frame bad raises at once, without the later calls of the message: the
others, blocked in those calls, fail when it revokes the communicator (``MPI_ERR_REVOKED``).

**Test hook (tests only).** ``NEREUS_TEST_FRAME_KILL`` — JSON ``{"kind": "plan", "at": 2,
"point": "torn", "ranks": [0, 1], "stamp": "/path"}`` — makes every process whose
``MPI_COMM_WORLD`` rank is in ``ranks`` SIGKILL itself at ``point`` of the ``at``-th (1-based)
message of ``kind`` it takes part in: ``before`` (no call of it made), ``prefix`` (prefix
exchanged, payload not), ``torn`` (its payload goes out with the second half zero-filled — the
bytes a dying sender leaves in flight, issue #25 — and it dies after the payload call; a rank of
the list that sends nothing dies there too), ``payload`` (payload exchanged, agreement not),
``agreed`` (agreement done, message not yet returned); a process due to die whose message
fails before its point (the others revoked on its torn bytes) dies then. ``stamp``: a file to
which the dying process appends ``<world rank> <unix time>``. The knob is read here only (at
each message, counting them per kind in this process) and does nothing when unset: it exists
for ``tests/test_frames.py`` and ``tests/test_frames_kill.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from nereus.errors import CommunicationError

FORMAT_VERSION = 1
MAGIC = b"NRFM"
ARRAY_KEY = "__nereus_array__"
DIGEST_BYTES = 32
_HEAD = struct.Struct("<4sHHQQ32s")  # magic, version, channel, header, body, digest
PREFIX_BYTES = _HEAD.size + 8  # + blake2b-64 of the fields above
SEGMENT_BYTES = 1 << 28  # one MPI_Bcast per 256 MiB of payload
ALIGN = 8
KILL_ENV = "NEREUS_TEST_FRAME_KILL"
POINTS = ("before", "prefix", "torn", "payload", "agreed")


class FrameError(CommunicationError):
    """A control-plane frame that is short, torn, corrupt or not the expected message; survivable
    like an MPI error from a dead peer (the survivors revoke, shrink and recover)."""


# -- plain data <-> bytes (pure) ---------------------------------------------------------------


def channel_of(kind: str) -> int:
    """The 16-bit code of a message kind in the prefix."""
    return zlib.crc32(kind.encode()) & 0xFFFF


def _plain(v: Any, arrays: list[np.ndarray]) -> Any:
    if v is None or isinstance(v, (bool, str, int, float)):
        return v
    if isinstance(v, np.ndarray):
        if v.dtype.hasobject:
            raise TypeError("control plane: an array of Python objects is not plain data")
        arrays.append(v if v.flags.c_contiguous else v.copy(order="C"))  # keeps 0-d shape
        return {ARRAY_KEY: len(arrays) - 1}
    if isinstance(v, np.generic):
        return _plain(v.item(), arrays)
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if not isinstance(k, str) or k == ARRAY_KEY:
                raise TypeError(f"control plane: dict key {k!r} (keys are strings)")
            out[k] = _plain(x, arrays)
        return out
    if isinstance(v, (list, tuple)):
        return [_plain(x, arrays) for x in v]
    raise TypeError(f"control plane: a {type(v).__name__} is not plain data")


def _head_check(fields: bytes) -> bytes:
    return hashlib.blake2b(fields, digest_size=8).digest()


def encode(obj: Any, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(prefix, payload) of ``obj`` as uint8 arrays; TypeError when ``obj`` is not plain data."""
    arrays: list[np.ndarray] = []
    structure = _plain(obj, arrays)
    table: list[tuple[str, list[int], int]] = []
    offset = 0
    for a in arrays:
        offset = -(-offset // ALIGN) * ALIGN
        table.append((a.dtype.str, list(a.shape), offset))
        offset += a.nbytes
    header = json.dumps({"v": structure, "a": table}, separators=(",", ":")).encode()
    payload = np.zeros(len(header) + offset, dtype=np.uint8)
    payload[:len(header)] = np.frombuffer(header, dtype=np.uint8)
    for a, (_, _, off) in zip(arrays, table, strict=True):
        start = len(header) + off
        payload[start:start + a.nbytes] = a.reshape(-1).view(np.uint8)
    digest = _digest(channel_of(kind), len(header), offset, payload)
    fields = _HEAD.pack(MAGIC, FORMAT_VERSION, channel_of(kind), len(header), offset, digest)
    prefix = np.frombuffer(fields + _head_check(fields), dtype=np.uint8).copy()
    return prefix, payload


def _digest(channel: int, header_len: int, body_len: int, payload: np.ndarray) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    h.update(struct.pack("<HHQQ", FORMAT_VERSION, channel, header_len, body_len))
    h.update(payload.data)
    return h.digest()


@dataclass(frozen=True)
class Prefix:
    header_len: int
    body_len: int
    digest: bytes

    @property
    def length(self) -> int:
        return self.header_len + self.body_len


def read_prefix(prefix: np.ndarray, kind: str, sender: str = "the root") -> Prefix:
    """The checked prefix of a ``kind`` message; FrameError when it is not one."""
    raw = bytes(prefix[:PREFIX_BYTES])
    if len(raw) != PREFIX_BYTES:
        raise FrameError(f"control plane: {kind} message from {sender}: short prefix "
                         f"({len(raw)} of {PREFIX_BYTES} bytes)")
    fields, check = raw[:_HEAD.size], raw[_HEAD.size:]
    magic, version, channel, header_len, body_len, digest = _HEAD.unpack(fields)
    if magic != MAGIC or check != _head_check(fields):
        raise FrameError(f"control plane: {kind} message from {sender}: torn or zero-filled "
                         "prefix (its sender died while sending it?)")
    if version != FORMAT_VERSION:
        raise FrameError(f"control plane: {kind} message from {sender}: frame format {version} "
                         f"!= {FORMAT_VERSION} (mixed installs?)")
    if channel != channel_of(kind):
        raise FrameError(f"control plane: expected a {kind} message from {sender}, got another "
                         "kind (the ranks are out of step)")
    return Prefix(header_len, body_len, digest)


def decode(head: Prefix, payload: np.ndarray, kind: str, sender: str = "the root") -> Any:
    """The plain data of a checked frame's payload; FrameError when it is short or corrupt."""
    where = f"control plane: {kind} message from {sender}"
    if payload.size != head.length:
        raise FrameError(f"{where}: short payload ({payload.size} of {head.length} bytes)")
    if _digest(channel_of(kind), head.header_len, head.body_len, payload) != head.digest:
        raise FrameError(f"{where}: checksum mismatch: torn or corrupt payload (its sender "
                         "died while sending it?)")
    try:
        doc = json.loads(bytes(payload[:head.header_len]).decode("utf-8"))
        body = payload[head.header_len:]
        arrays = [_array(body, str(dt), shape, int(off)) for dt, shape, off in doc["a"]]
        return _restore(doc["v"], arrays)
    except FrameError:
        raise
    except (ValueError, TypeError, KeyError, IndexError) as e:  # a verified frame we cannot read
        raise FrameError(f"{where}: undecodable frame: {type(e).__name__}: {e}") from None


def _array(body: np.ndarray, dtype: str, shape: list[int], offset: int) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise FrameError("control plane: a frame holds an array of Python objects")
    dims = tuple(int(s) for s in shape)
    if any(s < 0 for s in dims):
        raise FrameError(f"control plane: a frame holds an array of shape {dims}")
    n = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
    if offset < 0 or offset + n > body.size:
        raise FrameError(f"control plane: an array of {n} bytes at {offset} overruns the "
                         f"{body.size}-byte body")
    return body[offset:offset + n].view(dt).reshape(dims).copy()


def _restore(v: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(v, dict):
        if set(v) == {ARRAY_KEY}:
            return arrays[int(v[ARRAY_KEY])]
        return {k: _restore(x, arrays) for k, x in v.items()}
    if isinstance(v, list):
        return [_restore(x, arrays) for x in v]
    return v


# -- over MPI (effectful) ----------------------------------------------------------------------


def agree_digest(comm: Any, digest: bytes, kind: str) -> None:
    """Every rank contributes the digest of the message it holds; FrameError on every rank when
    they differ. Completes only with every rank's contribution (a dead rank: an MPI error)."""
    from mpi4py import MPI

    words = np.frombuffer(digest, dtype="<u4").astype(np.int64)
    mine = np.concatenate([words, -words])
    low = np.empty_like(mine)
    comm.Allreduce(mine, low, op=MPI.MIN)
    n = words.size
    if not np.array_equal(low[:n], -low[n:]):  # min != max for some word
        raise FrameError(f"control plane: the ranks hold different {kind} messages")


def bcast(comm: Any, obj: Any, root: int, kind: str) -> Any:
    """``obj`` of rank ``root`` on every rank of ``comm`` (collective; the others pass None)."""
    kill = _test_kill(kind)
    try:
        return _bcast(comm, obj, root, kind, kill)
    except BaseException:
        kill.fail()
        raise


def _bcast(comm: Any, obj: Any, root: int, kind: str, kill: _Kill) -> Any:
    me = comm.Get_rank()
    if me == root:
        prefix, payload = encode(obj, kind)
    else:
        prefix, payload = np.zeros(PREFIX_BYTES, dtype=np.uint8), np.zeros(0, dtype=np.uint8)
    kill.at("before")
    comm.Bcast(prefix, root=root)
    kill.at("prefix")
    head = read_prefix(prefix, kind)
    if me != root:
        payload = np.zeros(head.length, dtype=np.uint8)
    out = kill.torn(payload) if me == root else payload
    for start in range(0, head.length, SEGMENT_BYTES):
        comm.Bcast(out[start:start + SEGMENT_BYTES], root=root)
    kill.at("torn")
    kill.at("payload")
    got = decode(head, payload, kind)
    agree_digest(comm, head.digest, kind)
    kill.at("agreed")
    return got


def allgather(comm: Any, obj: Any, kind: str) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank of ``comm`` (collective)."""
    kill = _test_kill(kind)
    try:
        return _allgather(comm, obj, kind, kill)
    except BaseException:
        kill.fail()
        raise


def _allgather(comm: Any, obj: Any, kind: str, kill: _Kill) -> list[Any]:
    from mpi4py import MPI

    size = comm.Get_size()
    prefix, payload = encode(obj, kind)
    prefixes = np.zeros((size, PREFIX_BYTES), dtype=np.uint8)
    kill.at("before")
    comm.Allgather(prefix, prefixes)
    kill.at("prefix")
    heads = [read_prefix(prefixes[r], kind, f"rank {r}") for r in range(size)]
    counts = [h.length for h in heads]
    displs = [sum(counts[:r]) for r in range(size)]
    if sum(counts) >= 2**31:
        raise CommunicationError(f"control plane: a {kind} all-gather of {sum(counts)} bytes "
                                 "exceeds one MPI_Allgatherv")
    recv = np.zeros(sum(counts), dtype=np.uint8)
    comm.Allgatherv([kill.torn(payload), MPI.BYTE], [recv, counts, displs, MPI.BYTE])
    kill.at("torn")
    kill.at("payload")
    got = [decode(h, recv[d:d + h.length], kind, f"rank {r}")
           for r, (h, d) in enumerate(zip(heads, displs, strict=True))]
    agree_digest(comm, hashlib.blake2b(b"".join(h.digest for h in heads),
                                       digest_size=DIGEST_BYTES).digest(), kind)
    kill.at("agreed")
    return got


# -- the test hook (see the module docstring; inert unless NEREUS_TEST_FRAME_KILL is set) -------


@dataclass
class _Kill:
    point: str = ""  # the point of this message at which this process dies ("": none)
    stamp: str = ""

    def at(self, point: str) -> None:
        if self.point and point == self.point:
            self.fail()

    def fail(self) -> None:
        """Die now (a process due to die in this message whose message failed first: the
        others revoked the communicator on its torn bytes, or its node's other rank died)."""
        if self.point:
            import signal
            import time

            from mpi4py import MPI

            if self.stamp:
                with open(self.stamp, "a", encoding="utf-8") as fh:
                    fh.write(f"{MPI.COMM_WORLD.Get_rank()} {time.time():.6f}\n")
            os.kill(os.getpid(), signal.SIGKILL)

    def torn(self, payload: np.ndarray) -> np.ndarray:
        if self.point != "torn" or payload.size == 0:
            return payload
        out = payload.copy()
        out[payload.size // 2:] = 0
        return out


_NO_KILL = _Kill()
_seen: dict[str, int] = {}  # messages of each kind this process took part in (hook only)


def _test_kill(kind: str) -> _Kill:
    raw = os.environ.get(KILL_ENV)
    if not raw:
        return _NO_KILL
    spec = json.loads(raw)
    if spec.get("point") not in POINTS:
        raise ValueError(f"{KILL_ENV}: point {spec.get('point')!r} not in {POINTS}")
    _seen[kind] = _seen.get(kind, 0) + 1
    if spec["kind"] != kind or int(spec["at"]) != _seen[kind]:
        return _NO_KILL
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() not in {int(r) for r in spec["ranks"]}:
        return _NO_KILL
    return _Kill(str(spec["point"]), str(spec.get("stamp", "")))
