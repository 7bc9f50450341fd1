"""Tier 3 (real Slurm): the committed slurm/hetero.sbatch runs a job labelled as two vendors on
the local cluster with two partitions (``nvidia``: n1, ``amd``: n2–n3), one hetjob component on
each, as one MPI job of 4 ranks (issue 23)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.paths import REPO
from support.slurm_cluster import LocalSlurm, wait_job

from nereus.cluster.transport import CROSS_VENDOR

JOB = """
job: {algorithm: grpo, mode: async, global_batch: 4, samples_per_prompt: 2, minibatches: 2,
      prompt_len: 8, gen_len: 12, reward_model: true}
models: {actor: tiny-gpt, reference: tiny-gpt, reward: tiny-gpt}
cluster:
  gpus_per_node: 2
  nodes:
    - {count: 1, gpu: cpu, vendor: nvidia, memory_per_gpu_gb: 0.5, peak_tflops: 1.0}
    - {count: 1, gpu: cpu, vendor: amd, memory_per_gpu_gb: 0.5, hbm_gbps: 1000}
runtime: {steps: 2, reward: model}
"""


@pytest.mark.timeout(300)
def test_hetero_template_runs_one_mpi_job_across_two_partitions(slurm_cluster: LocalSlurm,
                                                                tmp_path: Path) -> None:
    cfg, log, out = tmp_path / "job.yaml", tmp_path / "run.h5", tmp_path / "out.txt"
    cfg.write_text(JOB)
    res = slurm_cluster.run("sbatch", "--parsable", f"--output={out}", "--time=00:05:00",
                            str(REPO / "slurm" / "hetero.sbatch"), str(cfg), "--log", str(log))
    job_id = res.stdout.strip().split(";")[0]
    info = wait_job(slurm_cluster, job_id, ("COMPLETED", "FAILED", "CANCELLED"), timeout_s=240)
    text = out.read_text() if out.exists() else ""
    assert info.state == "COMPLETED", text[-3000:]
    # one host entry per node of each component (2 tasks each), in component order
    (hosts,) = [ln for ln in text.splitlines() if "hetjob of 2 components" in ln]
    assert hosts.split("mpiexec on ")[1].count(":2") == 2, hosts
    from nereus.log.reader import read_run_log

    run = read_run_log(log)
    assert run.closed and list(run.steps["step"]) == [0, 1]
    events = dict(zip(run.events["kind"], run.events["detail"], strict=False))
    vendors = [p["vendor"] for p in events["devices"]["placements"]]
    assert vendors == ["nvidia", "nvidia", "amd", "amd"]
    assert all(k.startswith("host:") and k.endswith(CROSS_VENDOR)
               for k in events["weight-sync"]["transports"]), events["weight-sync"]
