"""The session-scoped ``slurm_cluster`` fixture (a local 3-node Slurm; see slurm_cluster.py).

Tests that use it are marked ``slurm``; they skip with the reason when slurmctld is missing or
we are not root. Every test leaves the nodes resumed and the queue empty for the next one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator

import pytest

from support.slurm_cluster import LocalSlurm, missing_requirements, start_local_slurm


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalSlurm]:
    reason = missing_requirements()
    if reason is not None:
        pytest.skip(reason)
    cluster = start_local_slurm()
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf_path)  # submitit's sbatch/scontrol read it
    try:
        yield cluster
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        cluster.run("scancel", "--full", "--user=root", check=False)
        with contextlib.suppress(AssertionError):
            cluster.wait_queue_empty(timeout_s=15)
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)
