"""Nothing a job receives from the network is unpickled, and no rendezvous store listens —
checked on the syntax trees of ``nereus/`` and ``launchers/`` (pure: nothing is run; the
running job is watched by ``tests/mpi/test_rendezvous_mpi.py``, see ``docs/security.md``).

- no module imports a pickle family module (``pickle``, ``cloudpickle``, ``dill``, ``marshal``,
  ``shelve``, …); no ``torch.load``; no ``numpy.load(..., allow_pickle=True)``;
- no torch.distributed ``*_object`` / ``*_object_list`` collective (they unpickle what arrives);
- no mpi4py lower-case (pickled) call on a communicator: the control plane is framed plain data
  over the buffer calls (``nereus.runtime.mpi.frames``);
- no ``TCPStore``; no ``tcp://`` or ``env://`` rendezvous; every ``init_process_group`` is given
  its ``store`` (without one torch builds a listening TCPStore from ``MASTER_ADDR``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PICKLERS = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "marshal", "shelve",
            "jsonpickle", "copyreg"}
OBJECT_COLLECTIVE = re.compile(r"_object(_list)?$")
MPI_PICKLED = {"bcast", "allgather", "gather", "scatter", "send", "recv", "isend", "irecv",
               "sendrecv", "alltoall", "reduce", "allreduce", "scan", "exscan", "ibsend",
               "issend", "bsend", "ssend", "mprobe", "improbe", "ibcast", "igather",
               "iallgather", "iscatter", "ialltoall", "ireduce", "iallreduce"}
# What holds an mpi4py communicator in this code base (the control plane's own framed
# ``plane.gather`` and the executor's ``wire.send`` are not communicators).
COMM_NAME = re.compile(r"(comm|COMM_|merged|inter|parent|world)", re.IGNORECASE)


def _modules() -> list[Path]:
    return sorted(p for part in ("nereus", "launchers") for p in (ROOT / part).rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


def _identifiers(node: ast.AST) -> list[str]:
    """The names a node refers to: attribute and plain names, imported names and aliases."""
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [a.name.rsplit(".", 1)[-1] for a in node.names]
    return []


def findings(path: Path) -> list[str]:
    """Every breach of the rules above in one module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad = []
    rel = _rel(path)  # once per module: per node it was most of the scan's time
    for node in ast.walk(tree):
        here = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            bad += [f"{here}: import {a.name}" for a in node.names
                    if a.name.split(".")[0] in PICKLERS]
        elif isinstance(node, ast.ImportFrom) and node.module \
                and node.module.split(".")[0] in PICKLERS:
            bad.append(f"{here}: from {node.module} import …")
        for name in _identifiers(node):
            if OBJECT_COLLECTIVE.search(name):
                bad.append(f"{here}: {name} (an object collective unpickles what arrives)")
            if name == "TCPStore":
                bad.append(f"{here}: TCPStore (listens on every interface, unauthenticated)")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith(("tcp://", "env://")):
            bad.append(f"{here}: {node.value!r} (a TCPStore rendezvous)")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            bad += _call_findings(here, node, node.func)
    return bad


def _call_findings(here: str, call: ast.Call, func: ast.Attribute) -> list[str]:
    owner = ast.unparse(func.value)
    keywords = {k.arg: k.value for k in call.keywords}
    if func.attr == "load" and owner == "torch":
        return [f"{here}: torch.load (unpickles)"]
    allow = keywords.get("allow_pickle")
    if func.attr == "load" and owner in ("np", "numpy") and allow is not None and not (
            isinstance(allow, ast.Constant) and allow.value is False):
        return [f"{here}: {owner}.load(allow_pickle=…) (unpickles object arrays)"]
    if func.attr in MPI_PICKLED and COMM_NAME.search(owner):
        return [f"{here}: {owner}.{func.attr} (mpi4py pickles lower-case calls)"]
    if func.attr == "init_process_group" and "store" not in keywords:
        return [f"{here}: init_process_group without store= (an env:// TCPStore)"]
    return []


def test_no_pickle_no_object_collective_no_listening_store_in_the_package() -> None:
    bad = [f for path in _modules() for f in findings(path)]
    assert not bad, "\n".join(bad)


def test_the_scan_finds_each_kind_of_breach(tmp_path: Path) -> None:
    """The rules catch what they name (so the scan above can fail)."""
    src = tmp_path / "bad.py"
    src.write_text(
        "import pickle\n"
        "from cloudpickle import dumps\n"
        "import torch, numpy as np\n"
        "import torch.distributed as dist\n"
        "from torch.distributed import TCPStore\n"
        "dist.all_gather_object(parts, mine)\n"
        "dist.broadcast_object_list(xs, src=0)\n"
        "s = dist.TCPStore('0.0.0.0', 1, 2, True)\n"
        "dist.init_process_group('gloo', init_method='tcp://h:1', rank=0, world_size=2)\n"
        "dist.init_process_group('gloo', rank=0, world_size=2)\n"
        "x = comm.bcast(obj, root=0)\n"
        "y = MPI.COMM_WORLD.allgather(obj)\n"
        "torch.load('f.pt')\n"
        "np.load('f.npy', allow_pickle=True)\n", encoding="utf-8")
    found = findings(src)
    for line in (1, 2, *range(5, 15)):
        assert any(f.startswith(f"bad.py:{line}:") for f in found), (line, found)
    assert not any(f.startswith(("bad.py:3:", "bad.py:4:")) for f in found), found
    good = tmp_path / "good.py"
    good.write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo', store=store, rank=0, world_size=2)\n"
        "dist.all_gather(parts, mine)\n"
        "frames.bcast(comm, obj, 0, 'plan')\n"
        "comm.Bcast(buf, root=0)\n"
        "plane.gather({'rank': 0})\n"
        "np.load('f.npz')\n", encoding="utf-8")
    assert findings(good) == []
