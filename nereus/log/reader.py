"""Read a run log (complete, being written, or left by a killed writer) into numpy arrays.

Opens with ``swmr=True``. Rows after the writer's last flush may be present only in part (their
extent reached the file, their data or JSON bytes did not); such rows at the end of a table are
dropped and counted in :attr:`RunLog.dropped_rows`. Anything else that does not match the schema —
not HDF5, truncated, another schema or version, a damaged row before the tail — raises
:class:`~nereus.errors.LogFormatError` with a one-line rule.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from nereus.errors import LogFormatError
from nereus.log import schema as S

Columns = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class RunLog:
    """A run log as plain data: ``tables[name][column]`` is a numpy array (json columns: object)."""

    path: str
    schema_version: int
    nereus_version: str
    created_unix_s: float
    run_meta: dict[str, Any]
    config: dict[str, Any]
    initial_plan: Any
    tables: Mapping[str, Columns]
    dropped_rows: Mapping[str, int]

    def rows(self, table: str) -> int:
        return int(self.tables[table]["step"].shape[0])

    @property
    def steps(self) -> Columns:
        return self.tables["steps"]

    @property
    def events(self) -> Columns:
        return self.tables["events"]

    @property
    def closed(self) -> bool:
        """Whether the writer closed the file: every segment's ``run-start`` has its
        ``run-end`` (a resumed run continues the file with a new segment)."""
        kinds = self.events["kind"]
        return bool(np.any(kinds == S.RUN_END)) and \
            int(np.sum(kinds == S.RUN_END)) >= int(np.sum(kinds == "run-start"))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _attr_text(attrs: Any, key: str, path: str) -> str:
    if key not in attrs:
        raise LogFormatError(path, f"attribute {key!r} missing")
    value = attrs[key]
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8")
    return str(value)


def _json_attr(attrs: Any, key: str, path: str) -> Any:
    text = _attr_text(attrs, key, path)
    try:
        return json.loads(text)
    except ValueError:
        raise LogFormatError(path, f"attribute {key!r} is not valid JSON") from None


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
# SWMR readers retry a metadata read whose checksum fails, with exponential backoff: HDF5's default
# of 100 attempts turns a damaged file into an hour-long hang. 24 attempts take ~20 ms.
_SWMR_READ_ATTEMPTS = 24


def _stored_end_of_file(path: str) -> int | None:
    """The end-of-file address a version 2/3 superblock at offset 0 records (None otherwise)."""
    with open(path, "rb") as fh:
        head = fh.read(48)
    if len(head) < 36 or not head.startswith(HDF5_SIGNATURE) or head[8] not in (2, 3):
        return None
    if head[9] != 8:  # size of offsets
        return None
    base = int.from_bytes(head[12:20], "little")
    return base + int.from_bytes(head[28:36], "little")


def swmr_fapl() -> Any:
    """A file-access property list with few metadata read attempts, or None if unavailable.

    h5py does not wrap H5Pset_metadata_read_attempts; call it on h5py's own libhdf5 (already
    loaded in this process) through ctypes. Linux only; elsewhere HDF5's default applies.
    """
    import ctypes

    import h5py

    try:
        with open("/proc/self/maps") as maps:
            libs = sorted(
                {ln.split()[-1] for ln in maps if "/libhdf5-" in ln or "/libhdf5.so" in ln}
            )
        if not libs:
            return None
        lib = ctypes.CDLL(libs[0])
        fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
        status = lib.H5Pset_metadata_read_attempts(
            ctypes.c_int64(fapl.id), ctypes.c_uint(_SWMR_READ_ATTEMPTS)
        )
        return fapl if status >= 0 else None
    except (OSError, AttributeError, ValueError):
        return None


def _open_swmr(path: str) -> Any:
    import h5py

    fapl = swmr_fapl()
    if fapl is None:
        return h5py.File(path, "r", swmr=True)
    flags = h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ
    return h5py.File(h5py.h5f.open(os.fsencode(path), flags, fapl=fapl))


def _open(path: str) -> Any:
    import h5py

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise LogFormatError(path, "no such file") from None
    except OSError as exc:
        raise LogFormatError(path, f"cannot read: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise LogFormatError(path, "is a directory, not a run log (name the .h5 file)")
    if not stat.S_ISREG(mode):
        from nereus.config.files import kind_of

        raise LogFormatError(path, f"is {kind_of(mode)}, not a run log file")
    try:
        size = os.path.getsize(path)
        stored_eof = _stored_end_of_file(path)
    except OSError as exc:
        raise LogFormatError(path, f"cannot read: {exc.strerror}") from None
    if not h5py.is_hdf5(path):
        raise LogFormatError(path, "not an HDF5 file (foreign, empty, or cut before its header)")
    if stored_eof is not None and stored_eof > size:
        raise LogFormatError(
            path, f"truncated HDF5 file ({size} bytes, its superblock records {stored_eof})"
        )
    try:
        return _open_swmr(path)
    except Exception as exc:
        swmr_error = _first_line(exc)
    if "truncated" in swmr_error:
        raise LogFormatError(path, f"truncated HDF5 file ({swmr_error})")
    try:
        with h5py.File(path, "r") as f:
            ours = f.attrs.get(S.ATTR_FORMAT) is not None
    except Exception as exc:
        raise LogFormatError(path, f"unreadable HDF5 file ({_first_line(exc)})") from None
    if not ours:
        raise LogFormatError(path, f"HDF5 file without the {S.FORMAT_NAME} schema")
    raise LogFormatError(path, f"unreadable HDF5 file ({swmr_error})")


def _check_header(f: Any, path: str) -> tuple[int, str, float]:
    fmt = f.attrs.get(S.ATTR_FORMAT)
    if fmt is None:
        raise LogFormatError(path, f"HDF5 file without the {S.FORMAT_NAME} schema")
    if _attr_text(f.attrs, S.ATTR_FORMAT, path) != S.FORMAT_NAME:
        raise LogFormatError(path, f"attribute {S.ATTR_FORMAT} is not {S.FORMAT_NAME!r}")
    try:
        version = int(f.attrs[S.ATTR_VERSION])
    except (KeyError, TypeError, ValueError):
        raise LogFormatError(
            path, f"attribute {S.ATTR_VERSION} missing or not an integer"
        ) from None
    if not 1 <= version <= S.SCHEMA_VERSION:
        raise LogFormatError(
            path, f"schema version {version}; this nereus reads versions 1-{S.SCHEMA_VERSION}"
        )
    nereus_version = _attr_text(f.attrs, S.ATTR_NEREUS_VERSION, path)
    created = float(f.attrs.get(S.ATTR_CREATED, np.nan))
    return version, nereus_version, created


def _dataset(f: Any, name: str, dtype: np.dtype | None, path: str) -> Any:
    import h5py

    obj = f.get(name)
    if not isinstance(obj, h5py.Dataset):
        raise LogFormatError(path, f"required dataset /{name} missing")
    if obj.ndim != 1:
        raise LogFormatError(path, f"dataset /{name} is not 1-D")
    if dtype is not None and obj.dtype.names != dtype.names:
        raise LogFormatError(path, f"dataset /{name} has fields {obj.dtype.names}")
    return obj


def _stored_rows(ds: Any, path: str) -> int:
    """Rows of ``ds`` whose bytes can be in the file. An extent may claim more — rows never
    written read as fill values (uncommitted) — and a crafted one (10**9 rows in a 100 KB file)
    must not make the reader allocate gigabytes: rows past the stored bytes, plus one chunk of
    slack for a chunk being written, are not read."""
    plist = ds.id.get_create_plist()
    if plist.get_nfilters():
        raise LogFormatError(path, f"dataset /{ds.name.lstrip('/')} is compressed or filtered "
                             "(a run log never is)")
    chunk = ds.chunks[0] if ds.chunks else ds.shape[0]
    stored = int(ds.id.get_storage_size()) // max(1, ds.dtype.itemsize)
    return int(min(ds.shape[0], stored + chunk))


def _decode_table(
    table: S.Table, raw: np.ndarray, heap: np.ndarray, path: str
) -> tuple[dict[str, np.ndarray], int]:
    """Columns of the committed rows, and how many uncommitted rows were cut off the tail."""
    n = raw.shape[0]
    ok = raw[S.COMMITTED] == 1
    blobs: dict[str, list[Any]] = {name: [None] * n for name in table.json_columns}
    for name in table.json_columns:
        offs = raw[f"{name}_off"].astype(np.int64)
        lens = raw[f"{name}_len"].astype(np.int64)
        for i in np.flatnonzero(ok):
            end = offs[i] + lens[i]
            if end > heap.shape[0]:
                ok[i] = False
                continue
            try:
                blobs[name][i] = json.loads(heap[offs[i] : end].tobytes().decode("utf-8"))
            except (ValueError, RecursionError):
                ok[i] = False
    bad = np.flatnonzero(~ok)
    keep = int(bad[0]) if bad.size else n
    if np.any(ok[keep:]):
        raise LogFormatError(path, f"dataset /{table.name}: damaged row {keep} before the last row")
    cols: dict[str, np.ndarray] = {}
    for c in table.columns:
        if c.kind == "json":
            arr = np.empty(keep, dtype=object)
            arr[:] = blobs[c.name][:keep]
            cols[c.name] = arr
        elif c.kind == "name":
            cols[c.name] = np.char.decode(raw[c.name][:keep], "ascii")
        else:
            cols[c.name] = np.asarray(raw[c.name][:keep])
    return cols, n - keep


def _latest_per_step(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The steps table with one row per step: a resumed run that restarted from a boundary
    before a step it had already logged (a preempted rank abandoned its step just after the
    step was logged, :mod:`nereus.runtime.failures.preemption`) ran that step again; its later
    row is the step of the run (the earlier one stays in the file)."""
    steps = cols["step"]
    if np.unique(steps).size == steps.size:
        return cols
    last = {int(s): i for i, s in enumerate(steps)}
    keep = np.array(sorted(last.values()), dtype=np.int64)
    return {name: col[keep] for name, col in cols.items()}


def read_run_log(path: str | os.PathLike[str]) -> RunLog:
    """Read and validate a run log; raise LogFormatError(path, rule) if it is not one."""
    spath = os.fspath(path)
    f = _open(spath)
    try:
        version, nereus_version, created = _check_header(f, spath)
        run = f.get(S.RUN_GROUP)
        if run is None:
            raise LogFormatError(spath, f"required group /{S.RUN_GROUP} missing")
        meta = _json_attr(run.attrs, S.ATTR_META_JSON, spath)
        config = _json_attr(run.attrs, S.ATTR_CONFIG_JSON, spath)
        plan = _json_attr(run.attrs, S.ATTR_INITIAL_PLAN_JSON, spath)
        datasets = {t.name: _dataset(f, t.name, S.compound_dtype(t), spath) for t in S.TABLES
                    if t.since <= version}
        heap_ds = _dataset(f, S.HEAP, None, spath)
        # Tables first, then the heap: the writer appends JSON bytes before the rows naming them.
        try:
            raws = {name: ds[: _stored_rows(ds, spath)] for name, ds in datasets.items()}
            for t in S.TABLES:  # tables newer than the log: empty
                raws.setdefault(t.name, np.zeros(0, dtype=S.compound_dtype(t)))
            heap = np.asarray(heap_ds[: _stored_rows(heap_ds, spath)], dtype=np.uint8)
        except Exception as exc:
            raise LogFormatError(spath, f"truncated or damaged data ({_first_line(exc)})") from None
    except LogFormatError:
        raise
    except Exception as exc:
        raise LogFormatError(spath, f"unreadable run log ({_first_line(exc)})") from None
    finally:
        f.close()
    tables: dict[str, Columns] = {}
    dropped: dict[str, int] = {}
    for t in S.TABLES:
        tables[t.name], dropped[t.name] = _decode_table(t, raws[t.name], heap, spath)
    tables["steps"] = _latest_per_step(dict(tables["steps"]))
    if not isinstance(meta, dict) or not isinstance(config, dict):
        raise LogFormatError(spath, "run meta and config must be JSON objects")
    return RunLog(
        path=spath,
        schema_version=version,
        nereus_version=nereus_version,
        created_unix_s=created,
        run_meta=meta,
        config=config,
        initial_plan=plan,
        tables=tables,
        dropped_rows=dropped,
    )
