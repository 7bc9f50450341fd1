"""nereus.cluster.env: the job environment parsed from environments recorded on Slurm 22.05
(srun --mpi=pmi2 step, batch shell), Open MPI 5 mpiexec and torchrun-style variables."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus.cluster.env import from_os_environ, parse_job_environment
from nereus.errors import ConfigError

# Recorded inside `srun --mpi=pmi2 -n2` of a 2-node job on the local cluster (rank 1).
SRUN_PMI2_RANK1 = {
    "PMI_FD": "11", "PMI_JOBID": "3.0", "PMI_RANK": "1", "PMI_SIZE": "2",
    "SLURM_JOB_ID": "3", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1", "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_STEPID": "0",
    "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURMD_NODENAME": "n2",
    "SLURM_CPUS_ON_NODE": "1", "SLURM_SUBMIT_DIR": "/work",
}
# Recorded in the batch shell of a 3-node job (no step: SLURM_PROCID=0 is the shell's).
BATCH_SHELL = {
    "SLURMD_NODENAME": "n1", "SLURM_JOBID": "1", "SLURM_JOB_ID": "1",
    "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_NUM_NODES": "3", "SLURM_NODEID": "0",
    "SLURM_NTASKS": "3", "SLURM_PROCID": "0", "SLURM_TASKS_PER_NODE": "1(x3)",
    "SLURM_CPUS_ON_NODE": "1", "SLURM_JOB_CPUS_PER_NODE": "1(x3)",
}
# Recorded from `mpiexec --allow-run-as-root --oversubscribe -n 2 --host localhost:2 ...`.
OPENMPI_RANK1 = {
    "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_UNIVERSE_SIZE": "2", "PMIX_RANK": "1", "PRTE_LAUNCHED": "1",
}


def test_srun_pmi2_step() -> None:
    env = parse_job_environment(SRUN_PMI2_RANK1)
    assert (env.launcher, env.global_rank, env.world_size) == ("pmi", 1, 2)
    assert (env.local_rank, env.local_world_size, env.node_rank) == (0, 1, 1)
    assert env.job_nodes == ("n1", "n2") and env.step_nodes == ("n1", "n2")
    assert env.node_name == "n2" and env.slurm_job_id == "3" and env.slurm_step_id == "0"
    assert env.in_slurm and not env.is_controller and not env.no_kill


def test_batch_shell_is_a_single_process_of_the_job() -> None:
    env = parse_job_environment(BATCH_SHELL)
    assert (env.launcher, env.global_rank, env.world_size) == ("none", 0, 1)
    assert env.job_nodes == ("n1", "n2", "n3") and env.step_nodes == ()
    assert env.node_rank is None and env.slurm_step_id is None


def test_openmpi_wins_over_the_slurm_batch_variables() -> None:
    env = parse_job_environment({**BATCH_SHELL, **OPENMPI_RANK1})
    assert (env.launcher, env.global_rank, env.world_size, env.local_rank) == ("openmpi", 1, 2, 1)
    assert env.local_world_size == 2 and env.job_nodes == ("n1", "n2", "n3")


def test_srun_without_pmi_and_tasks_per_node_expansion() -> None:
    env = parse_job_environment({
        "SLURM_JOB_ID": "9", "SLURM_STEP_ID": "1", "SLURM_PROCID": "4", "SLURM_NTASKS": "5",
        "SLURM_LOCALID": "0", "SLURM_NODEID": "2", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1"})
    assert (env.launcher, env.global_rank, env.world_size, env.local_world_size) == (
        "srun", 4, 5, 1)


def test_torchrun_and_rendezvous_and_devices() -> None:
    env = parse_job_environment({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                                 "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "n1",
                                 "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": "0,1",
                                 "ROCR_VISIBLE_DEVICES": "2"})
    assert (env.launcher, env.global_rank, env.local_rank) == ("torchrun", 3, 1)
    assert (env.master_addr, env.master_port) == ("n1", 29500)
    assert env.cuda_visible_devices == "0,1" and env.rocr_visible_devices == "2"
    assert not env.in_slurm


@pytest.mark.parametrize("value,expected", [("set", True), ("SET", True), ("on", True),
                                            ("", True), ("1", False), ("off", False)])
def test_no_kill_accepts_what_slurm_accepts(value: str, expected: bool) -> None:
    assert parse_job_environment({"SLURM_NO_KILL": value}).no_kill is expected


def test_restart_count() -> None:
    assert parse_job_environment({"SLURM_RESTART_COUNT": "2"}).restart_count == 2
    assert parse_job_environment({}).restart_count == 0


@pytest.mark.parametrize("env,field", [
    ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK"),
    ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE"),
    ({"PMI_RANK": "2", "PMI_SIZE": "2"}, "rank"),
    ({"MASTER_PORT": "-1"}, "MASTER_PORT"),
    ({"SLURM_JOB_NODELIST": "n[1-"}, "nodelist"),
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_NODEID": "0",
      "SLURM_STEP_TASKS_PER_NODE": "2(xq)"}, "SLURM_STEP_TASKS_PER_NODE"),
])
def test_bad_values_name_the_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_job_environment(env)
    assert info.value.field == field


@given(st.integers(1, 512).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))))
def test_openmpi_ranks_roundtrip(size_rank: tuple[int, int]) -> None:
    size, rank = size_rank
    env = parse_job_environment({"OMPI_COMM_WORLD_RANK": str(rank),
                                 "OMPI_COMM_WORLD_SIZE": str(size)})
    assert (env.global_rank, env.world_size, env.is_controller) == (rank, size, rank == 0)


def test_from_os_environ_reads_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_STEP_ID", "RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    assert from_os_environ().slurm_job_id == "1234"
