"""The GPU sbatch templates bind one GPU per rank (golden files) and the rank program turns the
environment they produce into that binding (nereus.cluster.env → nereus.cluster.devices).

Golden files: tests/support/golden/sbatch_nvidia.sbatch, sbatch_amd.sbatch; regenerate with
``NEREUS_UPDATE_GOLDEN=1``. Slurm-free: the templates are text, the binding a pure function.
"""

from __future__ import annotations

import os
import re

import pytest
from support.paths import GOLDEN

from launchers.templates import TEMPLATES, render_templates
from nereus.cluster.devices import DeviceFacts, select_device
from nereus.cluster.env import parse_job_environment


@pytest.mark.parametrize("name", ["nvidia", "amd"])
def test_gpu_template_golden(name: str) -> None:
    text = render_templates()[f"{name}.sbatch"]
    path = GOLDEN / f"sbatch_{name}.sbatch"
    if os.environ.get("NEREUS_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"slurm/{name}.sbatch differs from its golden file"


@pytest.mark.parametrize("name,vendor_env", [("nvidia", ()), ("amd", ("HSA_FORCE_FINE_GRAIN_PCIE",))])
def test_one_rank_per_gpu_and_the_collective_environment(name: str,
                                                         vendor_env: tuple[str, ...]) -> None:
    spec = TEMPLATES[f"{name}.sbatch"]
    text = render_templates()[f"{name}.sbatch"]
    gpus = int(re.search(r"#SBATCH --gpus-per-node=(\d+)", text).group(1))  # type: ignore[union-attr]
    tasks = int(re.search(r"#SBATCH --ntasks-per-node=(\d+)", text).group(1))  # type: ignore[union-attr]
    launch = next(ln for ln in text.splitlines() if ln.startswith("mpiexec "))
    assert gpus == tasks == spec.launch.ntasks_per_node == 8
    assert f"--map-by ppr:{gpus}:node" in launch and "--with-ft ulfm" in launch
    for var in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_DEBUG", "CUDA_DEVICE_MAX_CONNECTIONS",
                *vendor_env, "OMP_NUM_THREADS"):
        assert f" -x {var} " in launch, var  # every rank, on every node, gets it
    assert "export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}" in text
    assert "export NCCL_DEBUG=${NCCL_DEBUG:-WARN}" in text  # the user's value is kept
    assert "srun" not in launch and "--mpi=pmi2" not in text


@pytest.mark.parametrize("build,vendor,visible_var", [("cuda", "nvidia", "CUDA_VISIBLE_DEVICES"),
                                                      ("hip", "amd", "ROCR_VISIBLE_DEVICES")])
def test_the_ranks_mpiexec_starts_take_one_gpu_each(build: str, vendor: str,
                                                    visible_var: str) -> None:
    """The environment Open MPI gives rank 13 of 16 (node 1, local rank 5) under the template,
    with Slurm's list of the node's 8 GPUs: the rank binds device 5, its own."""
    seen = set()
    for local in range(8):
        env = {"OMPI_COMM_WORLD_RANK": str(8 + local), "OMPI_COMM_WORLD_SIZE": "16",
               "OMPI_COMM_WORLD_LOCAL_RANK": str(local), "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
               visible_var: "0,1,2,3,4,5,6,7"}
        job = parse_job_environment(env)
        facts = DeviceFacts(build, 8, (vendor,), job.local_rank, job.local_world_size,
                            job.cuda_visible_devices, job.rocr_visible_devices)
        c = select_device("auto", facts, vendor)
        assert (c.kind, c.vendor, c.index, c.shared) == ("cuda", vendor, local, False)
        seen.add(c.device_id)
    assert len(seen) == 8  # one GPU per rank, none shared


def test_amd_template_builds_for_the_rocm_archs_setup_py_names() -> None:
    """slurm/amd.sbatch exports PYTORCH_ROCM_ARCH (unless the user set it): setup.py's default
    targets, MI250X and MI300X — a build on the node compiles the kernels for both."""
    from support.paths import REPO

    setup_archs = re.search(r'^ROCM_ARCHS = "([^"]+)"', (REPO / "setup.py").read_text(), re.M)
    assert setup_archs is not None and set(setup_archs.group(1).split(";")) == {"gfx90a",
                                                                               "gfx942"}
    text = render_templates()["amd.sbatch"]
    assert f'export PYTORCH_ROCM_ARCH="${{PYTORCH_ROCM_ARCH:-{setup_archs.group(1)}}}"' in text
    assert "PYTORCH_ROCM_ARCH" not in render_templates()["nvidia.sbatch"]
