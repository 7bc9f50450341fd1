"""The sbatch script of the launcher golden file ``golden/sbatch_mpich.sbatch`` (checked in
pure/test_launchers.py; ranks/test_launchers_entry.py runs ``bash -n`` on it)."""

from __future__ import annotations

from launchers.commands import LaunchSpec
from launchers.sbatch import SbatchSpec

SCRIPT = SbatchSpec(
    job_name="golden", launcher="mpich", nodes=2, ntasks_per_node=2, partition="debug",
    time_limit="00:30:00", error="%x-%j.err", requeue=False, positional=("CONFIG", "STEPS"),
    extra_directives=("--exclusive",), setup_lines=("module load mpich",),
    launch=LaunchSpec(argv=("nereus", "run", "$CONFIG", "--steps", "$STEPS", "$@"),
                      ntasks_per_node=2))
