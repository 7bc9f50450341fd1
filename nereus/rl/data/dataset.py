"""A prompt file (jsonl or parquet) read into the prompts a run samples from.

Every row is a JSON object (jsonl: one per line, blank lines skipped; parquet: one per table
row, read with pyarrow). Each must hold the prompt column (``data.prompt_key``: a string, or a
list of chat messages) and, unless ``data.answer_key`` is null, the answer column. The prompts
are tokenized once (:class:`~nereus.rl.data.tokenizer.TextCodec`); those longer than
``data.max_prompt_len`` tokens are dropped and counted. A run samples the kept rows in the global
order of :mod:`nereus.rl.sample_order`; a kept row keeps its index in the file (``source``) for
logs and errors.

Every problem with a file — missing, not a regular file, empty, a line that is not UTF-8 or not a
JSON object, a row without the key, a parquet file without the column — is one ``ConfigError``
naming the field, the file and the row.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from nereus.config import limits
from nereus.config.data import DataOptions
from nereus.config.files import kind_of
from nereus.errors import ConfigError
from nereus.rl.data.tokenizer import TextCodec


@dataclass(frozen=True)
class PromptSet:
    """The kept rows of one prompt file, tokenized: row ``i`` is ``rows[i]``, its prompt ids
    ``ids[offsets[i]:offsets[i + 1]]``, its index in the file ``source[i]``."""

    field: str  # data.train or data.val
    path: str
    sha256: str  # of the file's bytes
    rows: tuple[dict[str, Any], ...]
    source: np.ndarray  # int64 [n]
    ids: np.ndarray  # int64, every kept prompt's ids back to back
    offsets: np.ndarray  # int64 [n + 1]
    total_rows: int
    dropped: int  # rows whose prompt is longer than max_prompt_len tokens

    @property
    def size(self) -> int:
        return len(self.rows)

    def prompt_ids(self, i: int) -> np.ndarray:
        return self.ids[int(self.offsets[i]):int(self.offsets[i + 1])]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def longest(self) -> int:
        return int(self.lengths.max()) if self.size else 0

    def summary(self) -> dict[str, Any]:
        """What the run log's ``data`` event records of it."""
        lengths = self.lengths
        return {"field": self.field, "path": self.path, "sha256": self.sha256,
                "rows": self.total_rows, "kept": self.size, "dropped": self.dropped,
                "prompt_len_mean": float(lengths.mean()) if self.size else 0.0,
                "prompt_len_p95": float(np.percentile(lengths, 95)) if self.size else 0.0,
                "prompt_len_max": self.longest}


def _open(path: str, field: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(field, path, "no such file") from None
    except IsADirectoryError:
        raise ConfigError(field, path, "is a directory, not a prompt file") from None
    except OSError as e:
        raise ConfigError(field, path, f"cannot be read ({e.strerror or e})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ConfigError(field, path, f"is {kind_of(info.st_mode)}, not a prompt file (only "
                          "regular files are read)")
    if info.st_size > limits.MAX_DATA_BYTES:
        os.close(fd)
        raise ConfigError(field, path, f"is {info.st_size:,} bytes; a prompt file may have at "
                          f"most {limits.MAX_DATA_BYTES:,} bytes (MAX_DATA_BYTES)")
    os.set_blocking(fd, True)
    return fd


def _jsonl_rows(path: str, field: str, digest: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) of each non-blank line; ``where`` names the line for errors."""
    fd = _open(path, field)
    with os.fdopen(fd, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            digest.update(raw)
            if len(raw) > limits.MAX_DATA_ROW_BYTES:
                raise ConfigError(field, path, f"line {lineno} has {len(raw):,} bytes; at most "
                                  f"{limits.MAX_DATA_ROW_BYTES:,} (MAX_DATA_ROW_BYTES)")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ConfigError(field, path, f"line {lineno} is not UTF-8 text") from None
            if lineno == 1:
                text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except (ValueError, RecursionError) as e:
                msg = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
                raise ConfigError(field, path, f"line {lineno} is not valid JSON ({msg})"
                                  ) from None
            if not isinstance(row, dict):
                raise ConfigError(field, path, f"line {lineno} is a JSON "
                                  f"{type(row).__name__}; each line must be a JSON object")
            yield f"line {lineno}", row


def _parquet_rows(path: str, field: str, digest: Any, needed: tuple[str, ...]
                  ) -> Iterator[tuple[str, dict[str, Any]]]:
    fd = _open(path, field)
    with os.fdopen(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(field, path, "needs pyarrow to read parquet (pip install "
                          "'nereus[data]')") from None
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow's errors: ArrowInvalid, OSError, ...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise ConfigError(field, path, f"is not a readable parquet file ({first})") from None
    for key in needed:
        if key not in table.column_names:
            raise ConfigError(field, path, f"has no column {key!r} (columns: "
                              f"{', '.join(table.column_names[:20])})")
    for i, row in enumerate(table.to_pylist()):
        yield f"row {i}", row


def _prompt(value: Any, where: str, field: str, path: str, key: str) -> Any:
    """The prompt of a row: a non-empty string or a list of ``{role, content}`` messages."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in value):
        return value
    raise ConfigError(field, path, f"{where}: {key!r} must be a non-empty string or a list "
                      "of chat messages {role, content}")


@dataclass(frozen=True)
class PromptRows:
    """The rows of a prompt file, checked but not yet tokenized."""

    field: str
    path: str
    sha256: str
    rows: tuple[dict[str, Any], ...]
    prompts: tuple[Any, ...]  # each row's prompt: a string or a list of chat messages


def read_rows(path: str, field: str, options: DataOptions) -> PromptRows:
    """The rows of the prompt file at ``path`` (absolute), every one checked."""
    needed = (options.prompt_key,) + (() if options.answer_key is None
                                      else (options.answer_key,))
    digest = hashlib.sha256()
    rows_in = (_parquet_rows(path, field, digest, needed) if path.endswith(".parquet")
               else _jsonl_rows(path, field, digest))
    rows: list[dict[str, Any]] = []
    prompts: list[Any] = []
    for where, row in rows_in:
        for key in needed:
            if key not in row:
                raise ConfigError(field, path, f"{where} has no key {key!r} (data."
                                  f"{'prompt_key' if key == options.prompt_key else 'answer_key'})")
        prompt = _prompt(row[options.prompt_key], where, field, path, options.prompt_key)
        if not isinstance(prompt, str) and not options.chat_template:
            raise ConfigError(field, path, f"{where}: {options.prompt_key!r} holds chat "
                              "messages; they need data.chat_template: true")
        rows.append(row)
        prompts.append(prompt)
    if not rows:
        raise ConfigError(field, path, "has no rows (an empty prompt file)")
    return PromptRows(field, path, digest.hexdigest(), tuple(rows), tuple(prompts))


def tokenize(raw: PromptRows, options: DataOptions, codec: TextCodec) -> PromptSet:
    """``raw``'s prompts tokenized, those longer than ``max_prompt_len`` dropped."""
    rows, field, path = raw.rows, raw.field, raw.path
    encoded = codec.encode_all(list(raw.prompts))
    keep = [i for i, ids in enumerate(encoded) if len(ids) <= options.max_prompt_len]
    if not keep:
        raise ConfigError("data.max_prompt_len", options.max_prompt_len,
                          f"drops every prompt of {field}={path} (the shortest has "
                          f"{min(len(e) for e in encoded)} tokens)")
    lengths = np.array([len(encoded[i]) for i in keep], dtype=np.int64)
    offsets = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.fromiter((t for i in keep for t in encoded[i]), dtype=np.int64,
                      count=int(offsets[-1]))
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= codec.vocab_size):
        raise ConfigError(field, path, "tokenizes to ids outside the tokenizer's vocabulary")
    return PromptSet(field, path, raw.sha256, tuple(rows[i] for i in keep),
                     np.array(keep, dtype=np.int64), ids, offsets, len(rows),
                     len(rows) - len(keep))


def read_prompts(path: str, field: str, options: DataOptions, codec: TextCodec) -> PromptSet:
    """The prompt file at ``path`` (absolute), checked, tokenized, long prompts dropped."""
    return tokenize(read_rows(path, field, options), options, codec)
