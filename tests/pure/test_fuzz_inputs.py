"""Hypothesis over the config loader and the command line: whatever the input, nereus ends with
exit status 0, 2 or 3; for 2 and 3, exactly one line on stderr and no traceback; and a failed
command leaves nothing behind (its working folder unchanged).

Three generators: the tiny example config with hostile values written into its fields (and
unknown keys added), raw YAML-ish text (anchors, aliases, tags, brackets), and command lines
of every subcommand built from its flags with hostile values (huge, negative, NaN, infinite,
paths to FIFOs, symlinks and existing files). Everything runs in-process through
``nereus.cli.main``; ``nereus run`` never launches (its mpiexec check fails on purpose).
Derandomized, so that the suite is repeatable; the examples stay small enough to take seconds.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.bad_inputs import SPOT, snapshot
from support.paths import REPO as ROOT

import nereus.commands.run as run_command
from nereus.cli import main

TINY = ROOT / "examples" / "ppo-tiny-cpu.yaml"
H200 = ROOT / "examples" / "ppo-llama8b-h200.yaml"
BASE: dict[str, Any] = yaml.safe_load(TINY.read_text())
SETTINGS = settings(max_examples=int(os.environ.get("FUZZ_N", "60")), deadline=None, derandomize=not os.environ.get("FUZZ_N"), database=None,
                    suppress_health_check=[HealthCheck.too_slow])

HOSTILE_INTS = st.sampled_from([-1, 0, 1, 2, 3, 7, 2**31 - 1, 2**31, 2**63, 10**30, -(10**30)])
HOSTILE_FLOATS = st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e300, -1e300,
                                  1e-300, 0.0, -0.5, 0.5, 1.0, 2.5])
HOSTILE_VALUES = st.recursive(
    st.one_of(HOSTILE_INTS, HOSTILE_FLOATS, st.booleans(), st.none(),
              st.text(max_size=12), st.sampled_from(["h200", "tiny-gpt", "ppo", "grpo", ""])),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=12,
)


def _leaf_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into the example's mappings and lists (each can be replaced)."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _leaf_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _leaf_paths(value, (*prefix, i))
    return out


PATHS = _leaf_paths(BASE)


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


@contextlib.contextmanager
def _in_folder() -> Iterator[Path]:
    """A fresh working folder (a FIFO, a dangling symlink and an existing file in it)."""
    with tempfile.TemporaryDirectory(prefix="nereus-fuzz-") as tmp:
        work = Path(tmp)
        os.mkfifo(work / "fifo")
        os.symlink(work / "nowhere", work / "dangling")
        (work / "existing.json").write_text("keep me\n")
        old = os.getcwd()
        os.chdir(work)
        try:
            yield work
        finally:
            os.chdir(old)


def _launch_disabled() -> None:
    raise run_command.LaunchError("launch disabled in this test")


def _call(argv: list[str], work: Path) -> None:
    """Run one command; check the exit status, stderr and that a failure left nothing."""
    before = snapshot(work)
    out, err = io.StringIO(), io.StringIO()
    with (mock.patch.object(run_command, "_mpiexec_ok", _launch_disabled),
          contextlib.redirect_stdout(out), contextlib.redirect_stderr(err)):
        rc = main(argv)
    text = err.getvalue()
    assert rc in (0, 2, 3), (argv, rc, text)
    assert "Traceback" not in text, (argv, text)
    if rc != 0:
        assert len(text.splitlines()) == 1, (argv, text)
        assert text.startswith("nereus: "), (argv, text)
        assert snapshot(work) == before, argv


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(PATHS), HOSTILE_VALUES), min_size=1, max_size=3),
       st.dictionaries(st.sampled_from(["job", "cluster", "models", "runtime", "extra"]),
                       st.dictionaries(st.text(min_size=1, max_size=8), HOSTILE_VALUES,
                                       max_size=2), max_size=1))
def test_config_fields_with_hostile_values(changes: list[tuple[tuple[Any, ...], Any]],
                                           extra: dict[str, dict[str, Any]]) -> None:
    doc = copy.deepcopy(BASE)
    for path, value in changes:
        with contextlib.suppress(KeyError, IndexError, TypeError):  # an earlier change removed it
            _replace(doc, path, value)
    for section, keys in extra.items():
        if isinstance(doc.get(section), dict):
            doc[section].update(keys)
        else:
            doc[section] = keys
    with _in_folder() as work:
        (work / "job.yaml").write_text(yaml.safe_dump(doc))
        _call(["config", "check", "job.yaml"], work)
        _call(["plan", "job.yaml", "--json"], work)
        _call(["run", "job.yaml", "--log", "run.h5", "--timeout-s", "30"], work)


YAML_PIECES = st.sampled_from([
    "job:", "models:", "cluster:", "runtime:", "  ", "\n", "- ", "&a ", "*a", "&b ", "*b", "[", "]",
    "{", "}", ",", ": ", "? ", "!!str ", "!!int ", "!!python/name:os.system ", "<<: ", "'", '"',
    "#", "---\n", "...\n", "nodes: ", "1", "9" * 30, ".nan", ".inf", "-", "1e+300", "2001-13-45",
    "\t", "|\n", ">\n", "%YAML 1.1\n", "\x00", "\ufeff", "é",
])


@SETTINGS
@given(st.lists(YAML_PIECES, max_size=40).map("".join))
def test_yaml_text_of_any_shape(text: str) -> None:
    with _in_folder() as work:
        (work / "job.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
        _call(["config", "check", "job.yaml"], work)


def _flag_value() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["0", "1", "2", "-1", "3", "8", "nan", "inf", "-inf", "1e300", "1e-300",
                         "100000000000000000000", "-100000000000000000000", "0.5", "", "x",
                         "fifo", "dangling", "existing.json", "missing.json", "/dev/zero", ".",
                         str(TINY), str(H200), str(SPOT), "paper:25-step", "paper:9-step"]),
        st.integers(-(10**12), 10**12).map(str),
    )


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


COMMANDS: dict[str, tuple[list[str], list[str]]] = {  # base argv, flags that take a value
    "plan": (["plan"], ["--gpus", "--gpus-per-node", "--seq-len", "--prompt-len",
                        "--global-batch", "--model", "--gpu", "--algo", "--mode",
                        "--calibration"]),
    "simulate": (["simulate", str(H200), "--gpu-trace", str(SPOT), "--length-trace",
                  "paper:25-step", "--steps", "2", "--json"],
                 ["--steps", "--gamma", "--noise", "--seed", "--every-k", "--max-gpus",
                  "--gpus-per-trace-node", "--gpu-trace", "--length-trace", "--calibration",
                  "--save-calibration", "--log", "--policy", "--gpus"]),
    "run": (["run", str(TINY), "--log", "run.h5"], ["--ranks", "--steps", "--timeout-s", "--log"]),
    "inventory": (["inventory", "--json"], ["--virtual-devices", "--virtual-memory-gb"]),
    "config": (["config", "check"], []),
    "report": (["report", "--no-plots"], ["--out"]),
}


@SETTINGS
@given(st.sampled_from(sorted(COMMANDS)), st.lists(st.tuples(st.integers(0, 20), _flag_value()),
                                                   max_size=4),
       st.lists(_flag_value(), max_size=2))
def test_command_lines_with_hostile_values(command: str, flags: list[tuple[int, str]],
                                           positional: list[str]) -> None:
    base, names = COMMANDS[command]
    argv = list(base)
    for which, value in flags:
        if names:
            argv += [names[which % len(names)], value]
    if command in ("config", "report"):
        argv += positional[:1]
    if command == "simulate":  # a valid simulation stays short: at most a few steps
        argv = [("2" if prev == "--steps" and 3 < (_int(a) or 0) <= 100_000 else a)
                for prev, a in zip(["", *argv[:-1]], argv, strict=True)]
    with _in_folder() as work:
        _call(argv, work)


@pytest.mark.parametrize("argv", [
    ["simulate", str(H200), "--gpu-trace", str(SPOT), "--length-trace", "paper:25-step",
     "--steps", "2", "--log", "new.h5", "--json"],
    ["plan", str(TINY), "--json"],
])
def test_the_fuzz_call_accepts_a_good_command(argv: list[str]) -> None:
    """The property check itself passes a good command (and sees its output file)."""
    with _in_folder() as work:
        _call(argv, work)
        assert argv[0] != "simulate" or (work / "new.h5").is_file()
