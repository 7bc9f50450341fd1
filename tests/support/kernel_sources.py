"""The kernel sources (``kernels/``) with their comments stripped, for the kernel tests
(pure/test_kernels_design.py, ranks/test_kernels_compile.py)."""

from __future__ import annotations

import re
from pathlib import Path

from support.paths import REPO

KERNELS = REPO / "kernels"


def code_of(path: Path) -> str:
    """The C/C++ text of ``path`` without its comments."""
    text = path.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)
