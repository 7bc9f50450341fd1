"""slurm/hetero.sbatch: hetjob components rendered by the one flag renderer (golden file), one
MPI job across the components' nodes, and the builder's one-line errors.

Golden file: tests/support/golden/sbatch_hetero.sbatch; regenerate with ``NEREUS_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import os

import pytest
from support.paths import GOLDEN

from launchers.commands import LaunchSpec, mpiexec_argv
from launchers.sbatch import HetComponent, SbatchSpec, sbatch_script
from launchers.templates import TEMPLATES, render_templates
from nereus.errors import ConfigError


def test_hetero_template_golden() -> None:
    text = render_templates()["hetero.sbatch"]
    path = GOLDEN / "sbatch_hetero.sbatch"
    if os.environ.get("NEREUS_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), "slurm/hetero.sbatch differs from its golden file"


def test_one_component_per_partition_and_one_mpiexec_over_all_of_them() -> None:
    text = render_templates()["hetero.sbatch"]
    directives = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    # job-wide options first (they belong to the first component), then one block per partition
    cut = directives.index("#SBATCH hetjob")
    assert directives.count("#SBATCH hetjob") == len(TEMPLATES["hetero.sbatch"].components) - 1
    assert "#SBATCH --partition=nvidia" in directives[:cut]
    assert "#SBATCH --partition=amd" in directives[cut:]
    assert "#SBATCH --requeue" in directives[:cut]
    (launch,) = [ln for ln in text.splitlines() if ln.startswith("mpiexec ")]
    assert '--host "$NEREUS_HOSTS"' in launch and "--map-by" not in launch
    assert "--mca ras '^slurm' --mca plm '^slurm'" in launch
    assert launch.endswith('nereus run "$CONFIG" "$@" &')


def test_builder_errors_name_the_field() -> None:
    comp = HetComponent("a", 1, 2)
    with pytest.raises(ConfigError) as e:
        SbatchSpec(job_name="j", launch=LaunchSpec(argv=("x",)), nodes=2, components=(comp,))
    assert e.value.field == "sbatch.components" and "per component only" in e.value.rule
    with pytest.raises(ConfigError) as e:
        LaunchSpec(argv=("x",), hosts_var="NOT A NAME")
    assert e.value.field == "launch.hosts_var"
    with pytest.raises(ConfigError) as e:
        mpiexec_argv(LaunchSpec(argv=("x",), mca=(("plm", "rsh"),)), "mpich")
    assert e.value.field == "launch.mca"
    # the components' shapes render through the same flag renderer as the rest
    text = sbatch_script(SbatchSpec(job_name="j", launch=LaunchSpec(argv=("x",)),
                                    components=(comp, HetComponent("b", 2, 1, gpus_per_node=1))))
    assert "#SBATCH hetjob\n#SBATCH --partition=b\n#SBATCH --nodes=2\n" in text
    assert "#SBATCH --gpus-per-node=1" in text
