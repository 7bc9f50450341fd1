"""The YAML bounds hold for every PyYAML the project accepts: the oldest (pyproject.toml's lower
bound) and the newest the package index serves, each run in a process of its own.

PyYAML 6.0.4's libyaml stops at a nesting limit of its own (1,000 levels) with a syntax error
before it yields the events past ``MAX_YAML_DEPTH``; with 6.0.3 and older it yields them. Either
way ``nereus config check`` must end in the one-line MAX_YAML_DEPTH error, never in the
RecursionError of PyYAML's composer. The wheels come from the package index (``pip download``);
without one reachable the test is skipped, saying so.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.bad_inputs import CORPUS
from support.paths import REPO


def _lower_bound() -> str:
    text = (REPO / "pyproject.toml").read_text()  # (tomllib: Python 3.11+; 3.10 is supported)
    m = re.search(r'"pyyaml\s*>=\s*([0-9.]+)', text, flags=re.IGNORECASE)
    assert m, "pyproject.toml names no pyyaml>= bound"
    return m.group(1)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Requirement → the folder its unpacked wheel is in."""
    out = {}
    for req in (f"pyyaml=={_lower_bound()}", "pyyaml"):
        dest = tmp_path_factory.mktemp("wheel")
        res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                              "--only-binary=:all:", "--quiet", "-d", str(dest), req],
                             capture_output=True, text=True, timeout=300, check=False)
        found = sorted(dest.glob("*.whl"))
        if res.returncode != 0 or not found:
            pytest.skip(f"pip download {req} failed (no package index here?): "
                        f"{(res.stderr or res.stdout).strip().splitlines()[-1:]}")
        unpacked = dest / "site"
        with zipfile.ZipFile(found[0]) as zf:
            zf.extractall(unpacked)
        out[req] = unpacked
    return out


SCRIPT = """
import sys, yaml
from nereus.cli import main
print("VERSION", yaml.__version__, yaml.__file__, getattr(yaml, "__with_libyaml__", False))
sys.stdout.flush()
sys.exit(main(["config", "check", sys.argv[1]]))
"""


@pytest.mark.parametrize("name", ["deep_nesting_20000.yaml", "deep_nesting.yaml"])
def test_the_depth_bound_holds_on_the_oldest_and_the_newest_pyyaml(
        wheels: dict[str, Path], name: str, tmp_path: Path) -> None:
    versions = set()
    for req, site in wheels.items():
        env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{REPO}")
        proc = subprocess.run([sys.executable, "-c", SCRIPT, str(CORPUS / name)],
                              capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=120, check=False)
        head = proc.stdout.splitlines()[0].split()
        assert head[0] == "VERSION" and head[2].startswith(str(site)), (req, proc.stdout)
        if req != "pyyaml":
            assert head[1] == req.split("==")[1]
        assert head[3] == "True", f"{req}: the wheel has no libyaml (the case to test)"
        versions.add(head[1])
        assert proc.returncode == 2, (req, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, (req, proc.stderr[-2000:])
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and "nests deeper than 32 levels (MAX_YAML_DEPTH)" in lines[0], (
            req, lines)
    assert len(versions) == 2, versions  # the lower bound is not the newest release
