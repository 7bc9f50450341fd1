"""Launch builders run for real on this host: the generated scripts parse in ``bash -n``, and
the submitit entry point runs its command as a child, signals it on checkpoint and kills a
child that ignores the signal."""

from __future__ import annotations

import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.launch_cases import SCRIPT

from launchers.sbatch import sbatch_script
from launchers.submitit_entry import EntryCommandError, NereusEntry
from launchers.templates import render_templates


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_generated_scripts_are_valid_bash(tmp_path: Path) -> None:
    for name, text in {**render_templates(), "golden": sbatch_script(SCRIPT)}.items():
        path = tmp_path / name
        path.write_text(text)
        res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert res.returncode == 0, f"{name}: {res.stderr}"


# ---------------------------------------------------------------- submitit entry point

def test_entry_runs_a_command_and_reports_failure(tmp_path: Path) -> None:
    ok = NereusEntry((sys.executable, "-c", "import sys; sys.exit(0)"))
    assert ok() == 0
    bad = NereusEntry((sys.executable, "-c", "import sys; sys.exit(4)"))
    with pytest.raises(EntryCommandError, match="exit 4"):
        bad()


def test_entry_checkpoint_signals_the_child_and_resumes_with_flag(tmp_path: Path) -> None:
    """checkpoint() (what submitit calls on preemption) -> SIGUSR1 to the running command ->
    DelayedSubmission of attempt 1, whose command carries --resume."""
    pytest.importorskip("submitit")
    code = ("import pathlib, signal, sys, time; d = pathlib.Path(sys.argv[1])\n"
            "if '--resume' in sys.argv: (d / 'resumed').write_text('yes'); sys.exit(0)\n"
            "signal.signal(signal.SIGUSR1, lambda *a: ((d / 'ckpt').write_text('7'), sys.exit(0)))\n"
            "(d / 'started').touch(); time.sleep(30); sys.exit(5)\n")
    entry = NereusEntry((sys.executable, "-c", code, str(tmp_path)), grace_s=10)
    result: list[object] = []
    runner = threading.Thread(target=lambda: result.append(entry()))
    runner.start()
    deadline = time.monotonic() + 20
    while not (tmp_path / "started").exists():
        assert time.monotonic() < deadline, "command did not start"
        time.sleep(0.05)
    delayed = entry.checkpoint()
    runner.join(timeout=20)
    assert result == [0]
    assert (tmp_path / "ckpt").read_text() == "7"
    nxt = delayed.function
    assert isinstance(nxt, NereusEntry) and nxt.attempt == 1
    assert nxt.command()[-1] == "--resume"
    again = pickle.loads(pickle.dumps(nxt))  # what submitit stores for the requeued job
    assert again() == 0 and (tmp_path / "resumed").read_text() == "yes"


def test_entry_kills_a_child_that_ignores_the_signal(tmp_path: Path) -> None:
    code = ("import pathlib, signal, sys, time; d = pathlib.Path(sys.argv[1]); "
            "signal.signal(signal.SIGUSR1, signal.SIG_IGN); (d / 'started').touch(); "
            "time.sleep(30)")
    entry = NereusEntry((sys.executable, "-c", code, str(tmp_path)), grace_s=0.5)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            entry()
        except EntryCommandError as exc:
            errors.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    while not (tmp_path / "started").exists():
        time.sleep(0.05)
    assert entry.stop_child() == -signal.SIGKILL
    runner.join(timeout=10)
    assert errors and "exit -9" in str(errors[0])
    assert entry.stop_child() is None  # nothing running any more
