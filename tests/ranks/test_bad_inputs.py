"""The bad-input corpus (tests/data/bad_inputs/manifest.yaml) against every command.

Each case must end in its exit status and one stderr line that contains its fragment, with no
traceback, nothing on stdout, nothing created, changed or removed (in the case's folder or in
the corpus), no hang (an alarm stops a case after ``CASE_LIMIT_S``) and no MPI job started
(``nereus run``'s launch is replaced by a failure in-process, and by a fake ``mpiexec`` on PATH
in a process of its own). Cases run in-process through ``nereus.cli.main``; those marked
``console`` run again as ``python -m nereus``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.bad_inputs import CORPUS, SPOT, snapshot
from support.paths import REPO as ROOT
from support.resume_files import RESUME_SETUPS

import nereus.commands.run as run_command
from nereus.cli import main

CASES: list[dict[str, Any]] = yaml.safe_load((CORPUS / "manifest.yaml").read_text())["cases"]
CASE_LIMIT_S = 30  # a case still running after this is a hang


# ---- what `setup` makes in the case's folder ----

def _fifo(d: Path, log: Path) -> None:
    os.mkfifo(d / "fifo")


def _dangling(d: Path, log: Path) -> None:
    os.symlink(d / "nowhere.h5", d / "dangling")


def _existing(d: Path, log: Path) -> None:
    (d / "existing.json").write_text("keep me\n")


def _link(d: Path, log: Path) -> None:
    os.symlink(d / "existing.json", d / "link")


def _existing_dir(d: Path, log: Path) -> None:
    (d / "existing_dir").mkdir()
    (d / "existing_dir" / "keep.txt").write_text("keep me\n")


def _big_config(d: Path, log: Path) -> None:
    line = "  # " + "padding " * 12 + "\n"
    (d / "big.yaml").write_text("job:\n" + line * (5_000_000 // len(line)) + "  algorithm: ppo\n")


def _big_field_csv(d: Path, log: Path) -> None:
    (d / "big_field.csv").write_text("step,mean,p95\n0,100," + "1" * 140_000 + "\n")


def _log(d: Path, log: Path) -> None:
    shutil.copy(log, d / "run.h5")


def _log_report(d: Path, log: Path) -> None:
    (d / "run_report").mkdir()


def _truncated_log(d: Path, log: Path) -> None:
    data = log.read_bytes()
    (d / "truncated.h5").write_bytes(data[: len(data) // 2])


def _foreign_h5(d: Path, log: Path) -> None:
    import h5py

    with h5py.File(d / "foreign.h5", "w") as f:
        f.create_dataset("x", data=[1, 2, 3])


def _filtered_log(d: Path, log: Path) -> None:
    import h5py

    path = d / "filtered.h5"
    shutil.copy(log, path)
    with h5py.File(path, "r+") as f:  # the steps table again, gzip-compressed
        rows = f["steps"][()]
        del f["steps"]
        f.create_dataset("steps", data=rows, maxshape=(None,), chunks=(64,), compression="gzip")


def _device(d: Path, log: Path) -> None:
    try:  # a null device of our own: a regression clobbers it, not /dev/null
        os.mknod(d / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here ({exc})")


def _no_gpu(d: Path, log: Path) -> None:
    from nereus.cluster.probe import visible_device_count

    if visible_device_count() > 0:
        pytest.skip("this machine has a GPU: runtime.device: cuda is not an error here")


SETUPS: dict[str, Callable[[Path, Path], None]] = {
    "fifo": _fifo, "dangling": _dangling, "existing": _existing, "link": _link,
    "existing_dir": _existing_dir, "big_config": _big_config, "big_field_csv": _big_field_csv,
    "log": _log, "log_report": _log_report, "truncated_log": _truncated_log,
    "foreign_h5": _foreign_h5, "filtered_log": _filtered_log, "device": _device,
    "no_gpu": _no_gpu, **RESUME_SETUPS,
}


@pytest.fixture(scope="module")
def valid_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nereus.log.writer import RunLogWriter

    path = tmp_path_factory.mktemp("log") / "run.h5"
    with RunLogWriter(path, {"kind": "test"}, {}) as w:
        for step in range(3):
            w.log_step(step, step_s=1.0 + step, pool_gpus=2, peak_memory_bytes=[1e9, 2e9])
    return path


# ---- running a case ----

def _fill(text: str, work: Path) -> str:
    for key, value in (("{corpus}", CORPUS), ("{tmp}", work), ("{examples}", ROOT / "examples"),
                       ("{spot}", SPOT), ("{log}", work / "run.h5"),
                       ("{h200}", ROOT / "examples" / "ppo-llama8b-h200.yaml"),
                       ("{tiny}", ROOT / "examples" / "ppo-tiny-cpu.yaml")):
        text = text.replace(key, str(value))
    return text


@contextlib.contextmanager
def _alarm(seconds: int) -> Iterator[None]:
    def fire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still running after {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _no_launch(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a bad input reached the MPI launch")


CORPUS_BEFORE = snapshot(CORPUS)


def _prepare(case: dict[str, Any], tmp_path: Path, log: Path) -> tuple[Path, list[str]]:
    work = tmp_path / "work"
    work.mkdir()
    for name in case.get("setup", []):
        SETUPS[name](work, log)
    return work, [_fill(a, work) for a in case["argv"]]


def _check_line(case: dict[str, Any], work: Path, err: str) -> None:
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    prefix = "nereus: infeasible: " if case["exit"] == 3 else "nereus: error: "
    assert lines[0].startswith(prefix), lines[0]
    assert _fill(case["fragment"], work) in lines[0], lines[0]
    if "absent" in case:
        assert case["absent"] not in lines[0], lines[0]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input_in_process(case: dict[str, Any], tmp_path: Path, valid_log: Path,
                              monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    work, argv = _prepare(case, tmp_path, valid_log)
    before = snapshot(work)
    monkeypatch.chdir(work)
    monkeypatch.setattr(run_command, "_mpiexec_ok", _no_launch)
    monkeypatch.setattr(run_command, "_launch", _no_launch)
    with _alarm(CASE_LIMIT_S):
        rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == case["exit"], err
    assert out == ""
    _check_line(case, work, err)
    assert snapshot(work) == before
    assert snapshot(CORPUS) == CORPUS_BEFORE


CONSOLE = [c for c in CASES if c.get("console")]


@pytest.mark.parametrize("case", CONSOLE, ids=[c["id"] for c in CONSOLE])
def test_bad_input_through_the_console_entry(case: dict[str, Any], tmp_path: Path,
                                             valid_log: Path) -> None:
    work, argv = _prepare(case, tmp_path, valid_log)
    before = snapshot(work)
    fake = tmp_path / "bin"  # an mpiexec that starts nothing: a regression cannot launch a job
    fake.mkdir()
    (fake / "mpiexec").write_text("#!/bin/sh\necho 'fake mpiexec: a bad input reached it' >&2\n"
                                  "exit 99\n")
    (fake / "mpiexec").chmod(0o755)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PATH=f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "nereus", *argv], capture_output=True,
                          text=True, env=env, cwd=work, timeout=CASE_LIMIT_S, check=False)
    assert proc.returncode == case["exit"], proc.stderr
    assert proc.stdout == ""
    _check_line(case, work, proc.stderr)
    assert snapshot(work) == before
    assert time.monotonic() - start < CASE_LIMIT_S


def test_the_corpus_is_large_and_every_file_is_used() -> None:
    assert len(CASES) >= 60
    assert len({c["id"] for c in CASES}) == len(CASES)
    commands = {c["argv"][0] for c in CASES}
    assert commands == {"config", "plan", "simulate", "report", "run", "inventory"}
    used = " ".join(a for c in CASES for a in c["argv"])
    files = sorted(p.name for p in CORPUS.iterdir() if p.name != "manifest.yaml")
    assert [f for f in files if f"{{corpus}}/{f}" not in used] == []
    for case in CASES:
        assert set(case.get("setup", [])) <= set(SETUPS), case["id"]
        assert case["exit"] in (2, 3) and case["fragment"], case["id"]


def test_a_5mb_config_is_refused_before_it_is_read(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from nereus.config import files
    from nereus.config.load import load_raw
    from nereus.errors import ConfigError

    _big_config(tmp_path, tmp_path)

    def no_read(fd: int, n: int) -> bytes:
        raise AssertionError("the oversized file was read")

    with monkeypatch.context() as m, pytest.raises(ConfigError, match="MAX_CONFIG_BYTES"):
        m.setattr(files.os, "read", no_read)  # os.read itself, for this call only
        load_raw(str(tmp_path / "big.yaml"))


def test_an_alias_bomb_is_refused_in_one_pass(tmp_path: Path) -> None:
    from nereus.config.load import parse_yaml
    from nereus.errors import ConfigError

    start = time.monotonic()
    with pytest.raises(ConfigError, match="MAX_YAML_VALUES"):
        parse_yaml((CORPUS / "alias_bomb.yaml").read_text())
    assert time.monotonic() - start < 5.0  # before: no end (the walk had no memo)
    # aliases within the limit still work (the examples use them), each node checked once
    text = "a: &a {k: 1}\n" + "".join(f"b{i}: *a\n" for i in range(1000))
    assert parse_yaml(text)["b999"] == {"k": 1}
