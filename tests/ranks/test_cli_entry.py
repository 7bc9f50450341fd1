"""The console entry (``python -m nereus``) as a child process: one stderr line and exit 2 on a
bad call, no traceback; and the README's planning command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli_cases import fill_argv, write_bad_files
from support.paths import REPO as ROOT


@pytest.fixture
def bad_files(tmp_path: Path) -> dict[str, str]:
    return write_bad_files(tmp_path)


def _run(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "nereus", *args], capture_output=True, text=True, env=env,
        cwd=ROOT, timeout=timeout_s, check=False,
    )


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["plan", "--gpus", "12"], "--gpus=12: must be a positive multiple of --gpus-per-node=8"),
        (["plan", "--unknown-flag"], "unrecognized arguments: --unknown-flag"),
        (["plan", "--gpu", "v100"], "--gpu='v100': unknown GPU preset"),
        (["config", "check", "{missing}"], "no such file"),
        (["config", "check", "{invalid}"], "not valid YAML"),
        (["config", "check", "{dir}"], "is a directory"),
    ],
)
def test_real_entry_point_prints_one_line_and_exits_2(
    argv: list[str], fragment: str, bad_files: dict[str, str]
) -> None:
    proc = _run(*fill_argv(argv, bad_files))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and fragment in proc.stderr
    assert proc.stdout == ""


def test_config_check_through_the_console_entry() -> None:
    proc = _run("config", "check", "examples/ppo-tiny-cpu.yaml")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK examples/ppo-tiny-cpu.yaml: ppo sync, 6 model-stages")
    assert "8 GPUs (2 nodes × 4 cpu, 0.5 GB each)" in proc.stdout


def test_readme_main_command_through_the_console_entry() -> None:
    proc = _run("plan", "examples/ppo-llama8b-h200.yaml", timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "critic-train" in proc.stdout


@pytest.mark.parametrize("flags", [["--virtual-devices", "0"], ["--virtual-memory-gb", "-1"],
                                   ["--virtual-memory-gb", "nan"]])
def test_cli_bad_flags_exit_2_with_one_line(flags: list[str]) -> None:
    res = subprocess.run([sys.executable, "-m", "nereus", "inventory", *flags],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and flags[0] in res.stderr
