"""``nereus run`` as a user runs it (the CLI as a child process) on a small PPO job, for
mpi/test_run_job.py and ranks/test_run_job_errors.py (the errors found before any rank starts);
and the 2-rank GRPO baseline run that mpi/test_run_job.py and mpi/test_engines_pipeline_run.py
both compare against (one session fixture)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.paths import REPO

SMALL = """
job: {algorithm: ppo, mode: sync, global_batch: 8, minibatches: 2, prompt_len: 8, gen_len: 16,
      reward_model: true}
models: {actor: tiny-gpt, critic: tiny-gpt, reference: tiny-gpt, reward: tiny-gpt}
cluster: {nodes: 4, gpus_per_node: 1, gpu: cpu, memory_per_gpu_gb: 0.5}
"""


def nereus(*args: str, timeout_s: float = 400.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nereus", *args], capture_output=True,
                          text=True, timeout=timeout_s, cwd=REPO)


def write_job(tmp: Path, name: str, runtime: str) -> Path:
    p = tmp / name
    p.write_text(SMALL + "runtime: " + runtime + "\n")
    return p


# GRPO, sync, on 1 node x 2 CPU ranks, the reward model's score as the reward: the job of
# mpi/test_engines_pipeline_run.py, and mpi/test_run_job.py's critic-free job for grpo (sync).
GRPO_2_RANKS = """
job: {algorithm: grpo, mode: sync, global_batch: 4, samples_per_prompt: 2, minibatches: 2,
      prompt_len: 8, gen_len: 12, reward_model: true}
models: {actor: tiny-gpt, reference: tiny-gpt, reward: tiny-gpt}
cluster: {nodes: 1, gpus_per_node: 2, gpu: cpu, memory_per_gpu_gb: 0.5}
"""
# its baseline: 2 steps, the initial plan kept (``%s``: where the final parameters go)
GRPO_2_RANKS_BASE = "{steps: 2, adapt: false, reward: model, save_state: %s}"


@pytest.fixture(scope="session")
def grpo_two_rank_base(tmp_path_factory: pytest.TempPathFactory
                       ) -> tuple[dict[str, Any], Path]:
    """The run of GRPO_2_RANKS with GRPO_2_RANKS_BASE, once per session: the baseline of the
    pipeline move (mpi/test_engines_pipeline_run.py) and of the critic-free test's grpo case
    (mpi/test_run_job.py), the same job, which ran it once each. (summary, final parameters'
    .npz)."""
    tmp = tmp_path_factory.mktemp("grpo-two-rank-base")
    cfg, npz = tmp / "base.yaml", tmp / "base.npz"
    cfg.write_text(GRPO_2_RANKS + "runtime: " + GRPO_2_RANKS_BASE % npz + "\n")
    res = nereus("run", str(cfg), "--log", str(tmp / "base.h5"), "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    return dict(json.loads(res.stdout.strip().splitlines()[-1])), npz
