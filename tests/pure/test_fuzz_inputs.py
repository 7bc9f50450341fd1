"""Hypothesis over the config loader and the command line: whatever the input, nereus ends with
exit status 0, 2 or 3 within ``CASE_LIMIT_S`` (an alarm ends a case that hangs); for 2 and 3,
exactly one line on stderr and no traceback; and a failed command leaves nothing behind (its
working folder unchanged). A value outside its field's range as docs/config.md states it
(:mod:`support.documented_ranges` reads the range from the page) must end in exit 2 and a line
naming the field — exit 0 is no longer accepted for it.

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
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.bad_inputs import CORPUS, SPOT, snapshot
from support.documented_ranges import Field, documented_fields, in_range, out_of_range
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
DOCUMENTED = documented_fields()
CASE_LIMIT_S = 20.0  # one command on a shared 2-core machine; a case past it is a hang


class Hang(Exception):
    pass


def _out_of_range(doc: Any) -> list[Field]:
    """The documented fields whose value in ``doc`` lies outside their documented range."""
    out = []
    for f in DOCUMENTED:
        node = doc
        for key in f.path:
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            if not in_range(f, node):
                out.append(f)
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        doc = doc.setdefault(key, {}) if isinstance(doc, dict) else doc[key]
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


def _alarm(signum: int, frame: Any) -> None:
    raise Hang(f"still running after {CASE_LIMIT_S} s")


def _call(argv: list[str], work: Path, *, refused: bool = False,
          names: tuple[str, ...] = ()) -> None:
    """Run one command; check the exit status, stderr, the time it took and that a failure
    left nothing. ``refused``: the status must be 2 (a value outside its documented range);
    ``names``: and the line must name one of these fields."""
    before = snapshot(work)
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, CASE_LIMIT_S)
    t0 = time.monotonic()
    try:
        with (mock.patch.object(run_command, "_mpiexec_ok", _launch_disabled),
              contextlib.redirect_stdout(out), contextlib.redirect_stderr(err)):
            rc = main(argv)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    took = time.monotonic() - t0
    text = err.getvalue()
    assert took < CASE_LIMIT_S, (argv, took)
    assert rc in (0, 2, 3), (argv, rc, text)
    assert "Traceback" not in text, (argv, text)
    if refused or names:
        assert rc == 2, (argv, names, rc, text)
    if names:
        assert any(f"error: {n}=" in text or f"error: {n}." in text for n in names), \
            (argv, names, text)
    if rc != 0:
        assert len(text.splitlines()) == 1, (argv, text)
        assert text.startswith("nereus: "), (argv, text)
        assert snapshot(work) == before, argv


def _config_commands(doc: Any, work: Path, *, named: bool = False) -> None:
    """``config check``, ``plan`` and ``run`` of ``doc``: each command that reads a field whose
    value lies outside its documented range exits 2 (``config check`` and ``plan`` pass the
    runtime section through; ``nereus run`` reads every section); ``named``: and its line names
    that field (when nothing else in ``doc`` is broken: the first broken rule is reported)."""
    bad = [f.name for f in _out_of_range(doc)]
    core = tuple(n for n in bad if not n.startswith("runtime."))
    (work / "job.yaml").write_text(yaml.safe_dump(doc))
    for argv, fields in ((["config", "check", "job.yaml"], core),
                         (["plan", "job.yaml", "--json"], core),
                         (["run", "job.yaml", "--log", "run.h5", "--timeout-s", "30"],
                          tuple(bad))):
        _call(argv, work, refused=bool(fields), names=fields if named else ())


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
        _config_commands(doc, work)


@SETTINGS
@given(st.sampled_from(DOCUMENTED).flatmap(
    lambda f: st.tuples(st.just(f), st.sampled_from(out_of_range(f)))))
def test_a_value_outside_its_documented_range_exits_2_naming_the_field(
        case: tuple[Field, Any]) -> None:
    """One field of the tiny example (or of its runtime section) set to a value its row of
    docs/config.md rules out: every command that reads it refuses it with exit 2 in one line
    naming it, within the time bound."""
    field, value = case
    doc = copy.deepcopy(BASE)
    _replace(doc, field.path, value)
    assert [f.name for f in _out_of_range(doc)] == [field.name]
    with _in_folder() as work:
        _config_commands(doc, work, named=True)


def test_every_documented_range_refuses_every_value_outside_it() -> None:
    """Every field and every out-of-range value of the table (the sample above also runs
    ``plan``): ``config check`` refuses each one outside the runtime section, ``nereus run``
    each one inside it, with exit 2 and a line naming the field."""
    with _in_folder() as work:
        for field in DOCUMENTED:
            argv = (["run", "job.yaml", "--log", "run.h5"] if field.path[0] == "runtime"
                    else ["config", "check", "job.yaml"])
            for value in out_of_range(field):
                doc = copy.deepcopy(BASE)
                _replace(doc, field.path, value)
                (work / "job.yaml").write_text(yaml.safe_dump(doc))
                _call(argv, work, names=(field.name,))


def test_the_documented_ranges_come_from_the_docs() -> None:
    """The table the tests above use is read from docs/config.md, and it covers every section
    (a parser that finds nothing would make them vacuous)."""
    kinds = {f.name: f.kind for f in DOCUMENTED}
    assert len(kinds) >= 40
    assert {f.path[0] for f in DOCUMENTED} == {"job", "models", "cluster", "controller",
                                               "runtime"}
    assert kinds["controller.memory_headroom"] == "num[0,1)"
    assert kinds["controller.horizon_alpha"] == "num(0,1]"
    assert kinds["job.gen_len_p95"] == "int>=0" and kinds["job.global_batch"] == "int>0"
    assert kinds["cluster.comm_setup_s"] == "num>=0" and kinds["models.reward.qk_norm"] == "bool"
    assert kinds["runtime.failures.relaunch_wait_s"] == "num>=0"
    assert {f.name: f.choices for f in DOCUMENTED}["job.algorithm"] == ("ppo", "grpo", "remax")
    assert all(not in_range(f, v) for f in DOCUMENTED for v in out_of_range(f))
    assert _out_of_range(BASE) == []  # the example itself is inside every range


def test_a_key_that_breaks_the_line_is_shown_escaped() -> None:
    """Found by the fuzz test above: an unknown key holding a carriage return made the one
    error line two; every character that would end a line is now shown escaped."""
    doc = copy.deepcopy(BASE)
    for key in ("\r", "a\nb", "\x85", "\u2028"):
        doc["job"] = {key: None}
        with _in_folder() as work:
            (work / "job.yaml").write_text(yaml.safe_dump(doc))
            _call(["config", "check", "job.yaml"], work, refused=True)


def test_the_readme_counts_the_bad_input_corpus_as_the_manifest_holds_it() -> None:
    """README's count of bad-input cases is the manifest's (both read here, so the test stays
    right as the corpus grows)."""
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    said = re.findall(r"bad-input corpus of ([\d,]+) cases", readme)
    cases = yaml.safe_load((CORPUS / "manifest.yaml").read_text())["cases"]
    assert said and {int(n.replace(",", "")) for n in said} == {len(cases)}, (said, len(cases))


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
