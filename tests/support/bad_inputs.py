"""What the bad-input corpus test (tests/ranks/test_bad_inputs.py) and the fuzz test
(tests/pure/test_fuzz_inputs.py) share: where the corpus and a real spot trace are, and a
snapshot of a folder to prove that a refused command left nothing behind."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from support.paths import REPO, TESTS

CORPUS = TESTS / "data" / "bad_inputs"
SPOT = REPO / "data" / "traces" / "spot-traces" / "availability-16node" / "us-east-2b_v100_1.json"


def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``root`` (symlinks not followed; regular files by content)."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            info = os.lstat(p)
            key = str(p.relative_to(root))
            if stat.S_ISREG(info.st_mode):
                out[key] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
            elif stat.S_ISLNK(info.st_mode):
                out[key] = ("link", os.readlink(p))
            else:
                out[key] = (stat.S_IFMT(info.st_mode),)
    return out
