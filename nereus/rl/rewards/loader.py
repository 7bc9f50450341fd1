"""``reward.fn`` as a callable: a built-in scorer, or a user's function from a Python file.

The file is compiled and run in a module of its own (named after its path's hash, registered in
``sys.modules`` so that pickling and dataclasses inside it work) without writing bytecode next to
it: loading a reward leaves the user's folder as it was. Its folder is not put on ``sys.path``;
a file that imports a sibling module needs that folder on ``PYTHONPATH``. A missing file, a file
that fails to import, a missing or non-callable name, or a function that does not take four
arguments is one ``ConfigError`` naming ``reward.fn``.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
import types
from collections.abc import Callable
from typing import Any

from nereus.config.data import RewardOptions, split_fn
from nereus.errors import ConfigError
from nereus.rl.data.paths import resolve

MAX_REWARD_FILE_BYTES = 4 << 20


def _first_line(e: BaseException) -> str:
    text = (str(e).strip().splitlines() or [""])[0][:200]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _module(path: str, fn: str) -> types.ModuleType:
    name = "nereus_reward_" + hashlib.sha256(path.encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise ConfigError("reward.fn", fn, f"no such file {path}") from None
    except OSError as e:
        raise ConfigError("reward.fn", fn, f"{path} cannot be read ({e.strerror})") from None
    if not os.path.isfile(path):
        raise ConfigError("reward.fn", fn, f"{path} is not a regular file")
    if size > MAX_REWARD_FILE_BYTES:
        raise ConfigError("reward.fn", fn, f"{path} has {size:,} bytes; a reward file may have "
                          f"at most {MAX_REWARD_FILE_BYTES:,}")
    try:
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("reward.fn", fn, f"{path} cannot be read ({_first_line(e)})") from None
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    try:
        exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)
    except BaseException as e:
        del sys.modules[name]
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ConfigError("reward.fn", fn, f"{path} fails to import ({_first_line(e)})"
                          ) from None
    return module


def _check_signature(func: Callable[..., Any], fn: str) -> None:
    try:
        sig = inspect.signature(func)
        sig.bind("prompt", "response", None, {})
    except ValueError:  # no signature to inspect (a builtin): called as it is
        return
    except TypeError:
        raise ConfigError("reward.fn", fn, "must take (prompt, response, answer, row) and return "
                          f"a number; it takes {sig}") from None


def load_reward(options: RewardOptions, base_dir: str) -> Callable[..., Any]:
    """The scoring function ``reward.fn`` names (``base_dir``: the config file's folder)."""
    fn = options.fn
    if options.builtin:
        from nereus.rl.rewards.builtin import SCORERS

        return SCORERS[fn]
    file, name = split_fn(fn)
    module = _module(resolve(file, base_dir), fn)
    func = getattr(module, name, None)
    if func is None:
        raise ConfigError("reward.fn", fn, f"{os.path.basename(file)} has no function {name!r}")
    if not callable(func):
        raise ConfigError("reward.fn", fn, f"{name!r} in {os.path.basename(file)} is a "
                          f"{type(func).__name__}, not a function")
    _check_signature(func, fn)
    return func
