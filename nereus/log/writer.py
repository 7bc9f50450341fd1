"""Append-only, crash-safe HDF5 run log (h5py, SWMR).

Records are buffered in memory by the ``log_*`` methods and written by :meth:`RunLogWriter.flush`
(which ``log_step`` calls by default, so every finished step is on disk before the next starts):
JSON bytes first, then the table rows, then an HDF5 flush. A reader opening the file with
``swmr=True`` — while it is written, or after the writer was killed — sees every flushed row.

A file system that fills up must not reach HDF5: once a write of its fails, the library can
neither flush nor close that file, and the process dies at exit (a segmentation fault). So each
flush first checks that the log's file system keeps ``MIN_FREE_BYTES`` free beyond what it
writes, and otherwise stops logging with :class:`LogWriteError` — one line — and closes the file
while that is still possible. A writer made with ``memory=True`` (``nereus simulate --log``)
builds the file in memory; :meth:`RunLogWriter.image` gives its bytes, to be written as a new
file (:mod:`nereus.log.outputs`).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import h5py
import numpy as np

from nereus import __version__
from nereus.errors import ConfigError, NereusError
from nereus.log import schema as S

# Free space a log's file system keeps beyond a flush's own bytes: HDF5's chunks (a table chunk,
# the 64 KiB heap chunk) and metadata, and the run-end record that close writes.
MIN_FREE_BYTES = 16 << 20


class LogWriteError(NereusError):
    """The run log cannot be written (its file system is full, read-only, or failing)."""


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"not JSON-serializable: {type(obj).__name__}")


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON as Python's json writes it (NaN and Infinity allowed)."""
    return json.dumps(value, separators=(",", ":"), default=_json_default).encode("utf-8")


def _name(field: str, value: str) -> bytes:
    text = str(value)
    if not (0 < len(text) <= S.NAME_BYTES and text.isascii()):
        raise ConfigError(field, value, f"must be 1..{S.NAME_BYTES} ASCII characters")
    return text.encode("ascii")


def check_space(path: str | os.PathLike[str], nbytes: int = 0) -> None:
    """LogWriteError unless the file system of the log ``path`` keeps ``MIN_FREE_BYTES`` free
    beyond ``nbytes``."""
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return  # no answer: the write itself will tell
    free = st.f_bavail * st.f_frsize
    if free < nbytes + MIN_FREE_BYTES:
        raise LogWriteError(
            f"run log {os.fspath(path)}: its file system has {free / 1e6:.1f} MB free; logging "
            f"needs {MIN_FREE_BYTES / 1e6:.0f} MB beyond what it writes (MIN_FREE_BYTES)"
        )


def _open_for_append(path: Path) -> h5py.File:
    """The log opened for writing; a superblock a killed SWMR writer left marked is cleared
    with ``h5clear -s`` first (HDF5 refuses to open it otherwise)."""
    try:
        return h5py.File(path, "r+", libver=("v110", "v110"))
    except OSError as exc:
        first = exc
    tool = shutil.which("h5clear")
    if tool is not None:
        subprocess.run([tool, "-s", str(path)], capture_output=True, timeout=60, check=False)
        try:
            return h5py.File(path, "r+", libver=("v110", "v110"))
        except OSError as exc:
            first = exc
    hint = "" if tool else " (install hdf5-tools for h5clear -s)"
    raise ConfigError("log path", str(path), f"cannot be reopened to continue it: "
                      f"{str(first).splitlines()[0]}{hint}") from None


class RunLogWriter:
    """One run segment's log file. Use as a context manager, or call :meth:`close`."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        run_meta: Mapping[str, Any],
        config: Mapping[str, Any],
        *,
        initial_plan: Any = None,
        overwrite: bool = False,
        memory: bool = False,
        start: Mapping[str, Any] | None = None,  # run-start detail (nereus run: its fingerprint)
    ) -> None:
        self.path = Path(path)
        self._buffer = io.BytesIO() if memory else None
        if not memory and os.path.lexists(self.path) and not overwrite:
            raise ConfigError(
                "log path",
                str(self.path),
                "exists; a run log is never overwritten — pick a new file",
            )
        meta_json = encode_json(dict(run_meta))
        config_json = encode_json(dict(config))
        plan_json = encode_json(initial_plan)
        self._check_space(len(meta_json) + len(config_json) + len(plan_json))
        target: Any = self._buffer if self._buffer is not None else self.path
        try:
            self._file = h5py.File(target, "w" if overwrite or memory else "x",
                                   libver=("v110", "v110"))
        except (OSError, FileExistsError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc).split("(")[0].strip()
            raise ConfigError("log path", str(self.path), f"cannot create: {reason}") from None
        try:
            f = self._file
            f.attrs[S.ATTR_FORMAT] = np.bytes_(S.FORMAT_NAME)
            f.attrs[S.ATTR_VERSION] = np.int64(S.SCHEMA_VERSION)
            f.attrs[S.ATTR_CREATED] = np.float64(time.time())
            f.attrs[S.ATTR_NEREUS_VERSION] = np.bytes_(__version__)
            run = f.create_group(S.RUN_GROUP)
            run.attrs[S.ATTR_META_JSON] = np.bytes_(meta_json)
            run.attrs[S.ATTR_CONFIG_JSON] = np.bytes_(config_json)
            run.attrs[S.ATTR_INITIAL_PLAN_JSON] = np.bytes_(plan_json)
            self._heap = f.create_dataset(
                S.HEAP, shape=(0,), maxshape=(None,), dtype="u1", chunks=(S.HEAP_CHUNK_BYTES,)
            )
            self._tables: dict[str, h5py.Dataset] = {}
            for table in S.TABLES:
                self._tables[table.name] = f.create_dataset(
                    table.name,
                    shape=(0,),
                    maxshape=(None,),
                    dtype=S.compound_dtype(table),
                    chunks=(table.chunk_rows,),
                )
            f.swmr_mode = True
        except BaseException:
            self._file.close()
            if self._buffer is None:
                self.path.unlink(missing_ok=True)
            raise
        self._start(0, [], -1, {"pid": os.getpid(), **dict(start or {})}, fresh=True)

    def _start(self, heap_len: int, transition_steps: list[int], last_step: int,
               start: dict[str, Any], fresh: bool = False) -> None:
        self._heap_len = heap_len
        self._pending_heap: list[bytes] = []
        self._pending_heap_len = 0
        self._pending_rows: dict[str, list[tuple[Any, ...]]] = {t.name: [] for t in S.TABLES}
        self._transition_steps = transition_steps
        self._last_step = last_step
        self._closed = False
        self._lock = threading.RLock()  # flush/close from a preempted rank's watch thread
        self.log_event(-1 if last_step < 0 else last_step, "run-start", start)
        try:
            self.flush()
        except LogWriteError:
            if self._buffer is None and fresh:  # a new log with nothing in it: leave no file
                self.path.unlink(missing_ok=True)
            raise

    @classmethod
    def append_to(cls, path: str | os.PathLike[str], start: Mapping[str, Any]) -> RunLogWriter:
        """Reopen an existing run log to continue it (a resumed run, ``nereus run --resume``):
        every row already in it is kept; rows a killed writer left uncommitted at a table's
        tail (never part of the log, see :mod:`nereus.log.reader`) are cut off; a
        ``run-start`` event with ``start`` opens the new segment. A file a killed SWMR writer
        left marked open is cleared with ``h5clear -s`` (hdf5-tools) when that is installed."""
        self = cls.__new__(cls)
        self.path = Path(path)
        self._buffer = None  # a resumed log is a file, never an in-memory image
        if not self.path.exists():
            raise ConfigError("log path", str(self.path), "does not exist; nothing to continue")
        self._file = _open_for_append(self.path)
        try:
            f = self._file
            if f.attrs.get(S.ATTR_FORMAT, b"") != np.bytes_(S.FORMAT_NAME):
                raise ConfigError("log path", str(self.path), "is not a nereus run log")
            if int(f.attrs.get(S.ATTR_VERSION, -1)) != S.SCHEMA_VERSION:
                raise ConfigError("log path", str(self.path),
                                  f"has schema {f.attrs.get(S.ATTR_VERSION)}, this nereus "
                                  f"writes {S.SCHEMA_VERSION}: continue it with that version")
            self._heap = f[S.HEAP]
            self._tables = {t.name: f[t.name] for t in S.TABLES}
            for ds in self._tables.values():  # a killed writer's uncommitted tail
                raw = ds[()]
                keep = int(raw.shape[0])
                while keep and raw[S.COMMITTED][keep - 1] != 1:
                    keep -= 1
                if keep < raw.shape[0]:
                    ds.resize((keep,))
            tr = self._tables["transitions"][()]
            steps = self._tables["steps"][()]
            f.swmr_mode = True
        except BaseException:
            self._file.close()
            raise
        self._start(int(self._heap.shape[0]), [int(x) for x in tr["step"]],
                    int(steps["step"].max()) if steps.shape[0] else -1,
                    {"pid": os.getpid(), **dict(start)})
        return self

    @property
    def last_step(self) -> int:
        """The highest step logged so far (a continued log: its earlier segments' too)."""
        return self._last_step

    # -- buffering ----------------------------------------------------------------------------

    def _row(self, table: str, values: Mapping[str, Any]) -> None:
        """Validate and buffer one row; its JSON values go to the heap only if all fields pass."""
        with self._lock:
            self._row_unlocked(table, values)

    def _row_unlocked(self, table: str, values: Mapping[str, Any]) -> None:
        if self._closed:
            raise ConfigError("run log", str(self.path), "is closed")
        row: list[Any] = []
        blobs: list[tuple[int, bytes]] = []  # (row index of the _off field, JSON bytes)
        for c in S.TABLE_BY_NAME[table].columns:
            v = values[c.name]
            if c.kind == "json":
                blobs.append((len(row), encode_json(v)))
                row += [0, 0]
            elif c.kind == "name":
                row.append(_name(c.name, v))
            elif c.kind == "f8":
                row.append(float(v))
            elif c.kind == "bool":
                row.append(bool(v))
            else:
                row.append(int(v))
        row.append(1)  # committed
        for index, raw in blobs:
            row[index], row[index + 1] = self._heap_len + self._pending_heap_len, len(raw)
            self._pending_heap.append(raw)
            self._pending_heap_len += len(raw)
        self._pending_rows[table].append(tuple(row))

    # -- records ------------------------------------------------------------------------------

    def log_step(
        self,
        step: int,
        *,
        step_s: float,
        gen_len_mean: float = math.nan,
        gen_len_p95: float = math.nan,
        pool_gpus: int = 0,
        stage_s: Mapping[str, float] | None = None,
        peak_memory_bytes: Mapping[int, int] | Sequence[int] | None = None,
        reward: float = math.nan,
        tokens: int = 0,
        wall_time_s: float | None = None,
        flush: bool = True,
    ) -> None:
        """One finished step. ``peak_memory_bytes``: global GPU id -> bytes (a sequence: ids 0..).

        Flushes the file (``flush=True``) so that a crash later loses nothing of this step.
        """
        plan_version = sum(1 for t in self._transition_steps if t < step)
        self._row(
            "steps",
            {
                "step": step,
                "wall_time_s": time.time() if wall_time_s is None else wall_time_s,
                "step_s": step_s,
                "gen_len_mean": gen_len_mean,
                "gen_len_p95": gen_len_p95,
                "pool_gpus": pool_gpus,
                "reward": reward,
                "tokens": tokens,
                "plan_version": plan_version,
                "stage_s": {str(k): float(v) for k, v in (stage_s or {}).items()},
            },
        )
        if peak_memory_bytes is not None:
            items = (
                peak_memory_bytes.items()
                if isinstance(peak_memory_bytes, Mapping)
                else enumerate(peak_memory_bytes)
            )
            for gpu, nbytes in items:
                self._row("gpu_memory", {"step": step, "global_gpu": gpu, "peak_bytes": nbytes})
        self._last_step = max(self._last_step, int(step))
        if flush:
            self.flush()

    def log_calibration_sample(
        self, step: int, hardware: str, op_class: str, ideal_s: float, measured_s: float
    ) -> None:
        self._row(
            "calibration_samples",
            {
                "step": step,
                "hardware": hardware,
                "op_class": op_class,
                "ideal_s": ideal_s,
                "measured_s": measured_s,
            },
        )

    def log_efficiency(self, step: int, hardware: str, op_class: str, efficiency: float) -> None:
        self._row(
            "efficiencies",
            {"step": step, "hardware": hardware, "op_class": op_class, "efficiency": efficiency},
        )

    def log_stage_time(self, step: int, model_stage: str, predicted_s: float,
                       measured_s: float) -> None:
        self._row("stage_times", {"step": step, "model_stage": model_stage,
                                  "predicted_s": predicted_s, "measured_s": measured_s})

    def log_fixed_cost(self, step: int, hardware: str, event: str, seconds: float) -> None:
        self._row("fixed_costs", {"step": step, "hardware": hardware, "event": event,
                                  "seconds": seconds})

    def log_replan(
        self,
        step: int,
        trigger: str,
        candidates: Any,
        predicted_s: Any,
        predicted_memory_bytes: Any,
    ) -> None:
        self._row(
            "replans",
            {
                "step": step,
                "trigger": trigger,
                "candidates": candidates,
                "predicted_s": predicted_s,
                "predicted_memory_bytes": predicted_memory_bytes,
            },
        )

    def log_admission(
        self,
        step: int,
        admitted: bool,
        path: str,
        reason: Any,
        delta_l_s: float,
        transition_s: float,
        horizon_steps: float,
    ) -> None:
        if path not in S.ADMISSION_PATHS:
            raise ConfigError("admission path", path, f"must be one of {S.ADMISSION_PATHS}")
        self._row(
            "admissions",
            {
                "step": step,
                "admitted": admitted,
                "path": path,
                "reason": reason,
                "delta_l_s": delta_l_s,
                "transition_s": transition_s,
                "horizon_steps": horizon_steps,
            },
        )

    def log_transition(
        self,
        step: int,
        dag: Any,
        primitives: Any,
        transfer_bytes: int,
        predicted_s: float,
        measured_s: float,
        plan: Any = None,
    ) -> None:
        """A transition executed after ``step``; ``plan`` (the new plan) is in force from step+1."""
        self._row(
            "transitions",
            {
                "step": step,
                "transfer_bytes": transfer_bytes,
                "predicted_s": predicted_s,
                "measured_s": measured_s,
                "dag": dag,
                "primitives": primitives,
                "plan": plan,
            },
        )
        self._transition_steps.append(int(step))

    def log_event(
        self, step: int, kind: str, detail: Any = None, time_s: float | None = None
    ) -> None:
        self._row(
            "events",
            {
                "step": step,
                "time_s": time.time() if time_s is None else time_s,
                "kind": kind,
                "detail": {} if detail is None else detail,
            },
        )

    # -- durability ---------------------------------------------------------------------------

    def _check_space(self, nbytes: int) -> None:
        if self._buffer is None:  # a log in memory: nothing to check
            check_space(self.path, nbytes)

    def _pending_bytes(self) -> int:
        rows = sum(len(r) * self._tables[n].dtype.itemsize for n, r in self._pending_rows.items())
        return self._pending_heap_len + rows

    def flush(self) -> None:
        """Write every buffered record and flush the file: it then survives a kill -9.

        A full or failing file system raises :class:`LogWriteError` and closes the file (the
        rows flushed before stay readable); the writer is then closed."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if self._closed:
            return
        try:
            self._check_space(self._pending_bytes())
            self._write_pending()
        except LogWriteError:
            self._abandon()
            raise
        except (OSError, RuntimeError) as exc:  # h5py's errors of a failed write
            self._abandon()
            reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0][:160]
            raise LogWriteError(f"run log {self.path}: cannot write ({reason})") from None

    def _abandon(self) -> None:
        """Stop logging: drop what is buffered and close the file if HDF5 still can."""
        self._closed = True
        for rows in self._pending_rows.values():
            rows.clear()
        self._pending_heap.clear()
        with contextlib.suppress(Exception):  # a file whose write failed may not close
            self._file.close()

    def _write_pending(self) -> None:
        if self._pending_heap:
            raw = np.frombuffer(b"".join(self._pending_heap), dtype="u1")
            end = self._heap_len + raw.size
            self._heap.resize((end,))
            self._heap[self._heap_len : end] = raw
            self._heap_len = end
            self._pending_heap.clear()
            self._pending_heap_len = 0
        # a step's row is its commit: the rows that belong to it (memory, calibration, ...)
        # reach the file first, so that a kill between the two never leaves a step whose rows
        # are missing
        steps = self._pending_rows["steps"]
        others = False
        for name, rows in self._pending_rows.items():
            if rows and name != "steps":
                self._append(name, rows)
                others = True
        if steps:
            if others:
                self._file.flush()
            self._append("steps", steps)
        self._file.flush()

    def _append(self, name: str, rows: list[tuple[Any, ...]]) -> None:
        ds = self._tables[name]
        start = ds.shape[0]
        ds.resize((start + len(rows),))
        ds[start:] = np.array(rows, dtype=ds.dtype)
        rows.clear()

    def close(self, *, clean: bool = True, error: str = "") -> None:
        """Flush, append a ``run-end`` event and close. Idempotent."""
        with self._lock:
            if self._closed:
                return
            detail: dict[str, Any] = {"clean": clean}
            if error:
                detail["error"] = error
            self.log_event(self._last_step, S.RUN_END, detail)
            self._flush()
            self._closed = True
            self._file.close()

    def image(self) -> bytes:
        """The bytes of a closed in-memory log (``memory=True``)."""
        if self._buffer is None or not self._closed:
            raise ValueError("image() is for a closed writer made with memory=True")
        return self._buffer.getvalue()

    def __enter__(self) -> RunLogWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.close(clean=False, error=f"{exc_type.__name__}: {exc}")
