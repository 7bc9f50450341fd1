"""New output files and folders that never clobber anything (``--log``, ``--save-calibration``,
``report --out``).

An output path must not exist yet — not as a file, a directory, a symlink (dangling or not), a
FIFO or a device — and its directory must exist and be writable: :func:`check_new_path`, called
before any work starts. The content is written under a temporary name in the same directory and
appears under its own name only when complete (:meth:`NewFile.publish`: a hard link, which fails
rather than replace a file that appeared meanwhile). A full or read-only file system ends in one
``ConfigError`` line and no file: the temporary one is removed.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Sequence

from nereus.config.files import kind_of
from nereus.errors import ConfigError


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def check_new_path(path: str, field: str) -> str:
    """``path`` made absolute, if nothing is there yet and its directory takes a new entry."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise ConfigError(field, path, "must be a file path")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:  # e.g. a component that is a file: ENOTDIR
        raise ConfigError(field, path, f"cannot be created ({_reason(exc)})") from None
    if info is not None:
        what = ("a symlink" if stat.S_ISLNK(info.st_mode) else
                "a file" if stat.S_ISREG(info.st_mode) else kind_of(info.st_mode))
        raise ConfigError(field, path, f"exists ({what}); an output is never overwritten — "
                          "pick a new name")
    parent = os.path.dirname(os.path.abspath(path))
    try:
        parent_info = os.stat(parent)
    except FileNotFoundError:
        raise ConfigError(field, path, "its directory does not exist") from None
    except OSError as exc:
        raise ConfigError(field, path, f"cannot be created ({_reason(exc)})") from None
    if not stat.S_ISDIR(parent_info.st_mode):
        raise ConfigError(field, path, f"its parent {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(field, path, f"its directory {parent} is not writable (permissions or "
                          "a read-only file system)")
    return os.path.abspath(path)


class NewFile:
    """One output file: checked now, written to a temporary file beside it, then published."""

    def __init__(self, path: str, field: str) -> None:
        self.path = check_new_path(path, field)
        self.field = field
        self.given = path
        self._tmp: str | None = None
        self.published = False

    def write(self, data: bytes) -> None:
        """Write ``data`` (all of it, synced) to the temporary file; nothing visible yet."""
        self.discard()
        directory, name = os.path.split(self.path)
        try:
            fd, self._tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=directory)
        except OSError as exc:
            raise ConfigError(self.field, self.given, f"cannot be created ({_reason(exc)})") from None
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            self.discard()
            raise ConfigError(self.field, self.given, f"cannot be written ({_reason(exc)}); "
                              "nothing was left behind") from None

    def publish(self) -> None:
        """The written file under its own name; refuses (and leaves nothing) if the name was
        taken meanwhile."""
        if self._tmp is None:
            raise ConfigError(self.field, self.given, "nothing was written")
        try:
            os.link(self._tmp, self.path)  # never replaces: EEXIST if the name is taken
        except FileExistsError:
            self.discard()
            raise ConfigError(self.field, self.given, "appeared while the command ran; it was "
                              "not overwritten") from None
        except OSError:  # a file system without hard links: check, then rename
            if os.path.lexists(self.path):
                self.discard()
                raise ConfigError(self.field, self.given, "appeared while the command ran; it "
                                  "was not overwritten") from None
            try:
                os.rename(self._tmp, self.path)
            except OSError as exc:
                self.discard()
                raise ConfigError(self.field, self.given,
                                  f"cannot be created ({_reason(exc)})") from None
            self._tmp = None
        self.discard()
        self.published = True

    def withdraw(self) -> None:
        """Remove the published file again (a later output of the same command failed)."""
        if self.published:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            self.published = False

    def discard(self) -> None:
        """Remove the temporary file, if any."""
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
            self._tmp = None


def publish_all(outputs: Sequence[NewFile]) -> None:
    """Publish every written output, or none: a failure withdraws those already published."""
    try:
        for out in outputs:
            out.publish()
    except BaseException:
        for out in outputs:
            out.withdraw()
            out.discard()
        raise


def check_distinct(outputs: Sequence[NewFile]) -> None:
    """Two outputs of one command may not name the same path."""
    seen: dict[str, str] = {}
    for out in outputs:
        if out.path in seen:
            raise ConfigError(out.field, out.given, f"is the same path as {seen[out.path]}")
        seen[out.path] = out.field


class NewFolder:
    """One output folder: checked now, filled under a temporary name beside it, then renamed."""

    def __init__(self, path: str, field: str) -> None:
        self.path = check_new_path(path, field)
        self.field = field
        self.given = path
        self.tmp: str | None = None

    def start(self) -> str:
        """Create the temporary folder to fill; returns its path."""
        directory, name = os.path.split(self.path)
        try:
            self.tmp = tempfile.mkdtemp(prefix=f".{name}.", suffix=".part", dir=directory)
        except OSError as exc:
            raise ConfigError(self.field, self.given, f"cannot be created ({_reason(exc)})") from None
        return self.tmp

    def publish(self) -> None:
        """The filled folder under its own name (refused if the name was taken meanwhile)."""
        assert self.tmp is not None, "start() first"
        if os.path.lexists(self.path):
            self.discard()
            raise ConfigError(self.field, self.given, "appeared while the command ran; it was "
                              "not overwritten")
        try:
            os.rename(self.tmp, self.path)
        except OSError as exc:
            self.discard()
            raise ConfigError(self.field, self.given, f"cannot be created ({_reason(exc)})") from None
        self.tmp = None

    def discard(self) -> None:
        """Remove the temporary folder and what it holds, if any."""
        if self.tmp is not None:
            import shutil

            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
