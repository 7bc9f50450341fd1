"""Launch builders: golden command lines and scripts, validation (in this process).

Golden files live in tests/support/golden/; regenerate with ``NEREUS_UPDATE_GOLDEN=1 pytest
tests/pure/test_launchers.py`` and review the diff. The committed slurm/*.sbatch must equal
``launchers.templates.render_templates()`` (regenerate with ``python3 -m launchers.templates``).
Real runs of what they build: ranks/test_launchers_entry.py (the submitit entry's child
commands, ``bash -n``), mpi/test_launchers_mpiexec.py, slurm/test_slurm_cluster.py.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from support.launch_cases import SCRIPT
from support.paths import GOLDEN
from support.slurm_watch_driver import on_survivors

from launchers.commands import LaunchSpec, mpiexec_argv, srun_argv
from launchers.sbatch import SbatchSpec, SubmitError, parse_job_id, sbatch_script, shell_word
from launchers.submitit_entry import NereusEntry, resolve_callable
from launchers.templates import render_templates
from nereus.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

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


# ---------------------------------------------------------------- submitit entry point


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
