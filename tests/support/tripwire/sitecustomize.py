"""A test tripwire (tests/mpi/test_rendezvous_mpi.py), loaded at start-up by every Python process
whose PYTHONPATH holds this folder, armed only when ``NEREUS_TRIPWIRE`` names a file.

Once a process imports them, the two points where received bytes would be unpickled are
replaced: torch.distributed's ``_tensor_to_object`` (every ``*_object`` collective, whoever
calls it — Nereus, Megatron-core, vLLM) and mpi4py's ``MPI.pickle.loads`` (every lower-case,
pickled mpi4py call). Each replacement appends ``<pid> armed <what>`` to the file when
installed and ``<pid> TRIPPED <what>`` plus the stack when called, then raises."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import traceback
from typing import Any

PATH = os.environ.get("NEREUS_TRIPWIRE", "")


def _note(line: str) -> None:
    with open(PATH, "a", encoding="utf-8") as fh:
        fh.write(f"{os.getpid()} {line}\n")


def _trip(what: str) -> Any:
    def tripped(*args: Any, **kwargs: Any) -> Any:
        _note(f"TRIPPED {what}\n{''.join(traceback.format_stack(limit=12))}")
        raise RuntimeError(f"tripwire: {what} would unpickle received bytes")
    return tripped


def _patch_c10d(module: Any) -> None:
    module._tensor_to_object = _trip("torch.distributed object collective")
    _note("armed torch.distributed")


def _patch_mpi(module: Any) -> None:
    import pickle

    module.pickle.__init__(pickle.dumps, _trip("mpi4py pickled call"))
    _note("armed mpi4py")


def _first_again(module: Any) -> None:
    """mpi4py puts its own finder (its MPI ABI variants) first: be first again."""
    if _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)
    sys.meta_path.insert(0, _HOOK)


PATCHES = {"torch.distributed.distributed_c10d": _patch_c10d, "mpi4py.MPI": _patch_mpi,
           "mpi4py": _first_again}


class _After(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Any) -> None:
        self.loader, self.patch = loader, patch

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        self.patch(module)


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in PATCHES:
            return None
        for finder in [f for f in sys.meta_path if f is not self]:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _After(spec.loader, PATCHES[name])
                return spec
        return None


_HOOK = _Hook()
if PATH:
    sys.meta_path.insert(0, _HOOK)
