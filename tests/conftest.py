"""Test tiers and shared fixtures.

Every test lives in one tier folder, named for what the test starts (README, *Tests by tier*):

- ``pure/``  — nothing but this process: no child process, no socket;
- ``ranks/`` — local child processes or gloo ranks, no MPI (the GlooPool harness, the CLI or an
  HDF5 writer run as a child, a compiler);
- ``mpi/``   — starts ``mpiexec`` (``nereus run``, the MPI control plane, failures, growth);
- ``slurm/`` — the local 3-node Slurm cluster (the ``slurm_cluster`` fixture);
- ``gpu/``   — needs a CUDA device.

The folder gives the test its tier marker, so ``pytest tests/mpi`` and ``pytest -m mpi`` select
the same tests; a test outside a tier folder, or marked with another tier than its folder's, is
a collection error. Helpers live in ``tests/support`` (imported as ``support.x``: this folder is
on ``sys.path``, pytest puts a rootdir conftest's folder there).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.failure_runs import six_rank_reference  # noqa: F401  (session fixture)
from support.run_jobs import grpo_two_rank_base  # noqa: F401  (session fixture)
from support.slurm_fixture import slurm_cluster  # noqa: F401  (session fixture: local 3-node Slurm)

TESTS = Path(__file__).resolve().parent
TIERS = ("pure", "ranks", "mpi", "slurm", "gpu")


def tier_of(path: Path) -> str | None:
    """The tier folder a test file lies in, or None."""
    try:
        first = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return first if first in TIERS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wrong = []
    for item in items:
        tier = tier_of(item.path)
        marked = {m.name for m in item.iter_markers() if m.name in TIERS}
        if tier is None or marked - {tier}:
            wrong.append(f"{item.nodeid}: folder tier {tier}, marked {sorted(marked)}")
            continue
        item.add_marker(getattr(pytest.mark, tier))
    if wrong:
        raise pytest.UsageError("tests outside their tier (tests/conftest.py):\n"
                                + "\n".join(wrong))
