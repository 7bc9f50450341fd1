"""Reading a file a user names (a config, a trace, a calibration): a regular file, size-capped.

A FIFO, a socket or a device (``/dev/zero``, ``/dev/stdin``) is refused, not read: a FIFO with
no writer would block forever and ``/dev/zero`` never ends. The size is checked before anything
is read, and the read itself stops one byte past the limit (a file that grows meanwhile). Every
failure is a one-line ``ConfigError`` naming the flag or field, the path and the rule.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from nereus.config import limits
from nereus.errors import ConfigError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def kind_of(mode: int) -> str:
    """``"a FIFO (named pipe)"`` …, or ``"not a regular file"`` for anything else irregular."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path: str, field: str, what: str, limit: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``limits.<limit>`` of them."""
    maximum = int(getattr(limits, limit))
    if not isinstance(path, str) or not path or "\0" in path:
        raise ConfigError(field, path, f"must be the path of a {what}")
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(field, path, "no such file") from None
    except IsADirectoryError:
        raise ConfigError(field, path, f"is a directory, not a {what}") from None
    except PermissionError:
        raise ConfigError(field, path, "cannot be read (permission denied)") from None
    except OSError as exc:
        raise ConfigError(field, path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(field, path, f"is {kind_of(info.st_mode)}, not a {what} "
                              "(only regular files are read)")
        if info.st_size > maximum:
            raise ConfigError(field, path, f"is {info.st_size:,} bytes; a {what} may have at "
                              f"most {maximum:,} bytes ({limit})")
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        size = 0
        while size <= maximum:
            chunk = os.read(fd, min(1 << 20, maximum + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(field, path, f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if size > maximum:
        raise ConfigError(field, path, f"grew past {maximum:,} bytes ({limit}) while being "
                          "read")
    return b"".join(chunks)


def read_text(path: str, field: str, what: str, limit: str) -> str:
    """The UTF-8 text of the regular file ``path`` (see :func:`read_bytes`)."""
    data = read_bytes(path, field, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(field, path, "is not UTF-8 text") from None


def parse_json(text: str, field: str, path: str) -> Any:
    """JSON text as data; malformed, too deeply nested or with an integer of thousands of
    digits, a one-line ``ConfigError``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(field, path, f"not valid JSON at line {exc.lineno}: {exc.msg}") from None
    except RecursionError:
        raise ConfigError(field, path, "not valid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer beyond Python's digit limit
        raise ConfigError(field, path, f"not valid JSON: {str(exc)[:120]}") from None
