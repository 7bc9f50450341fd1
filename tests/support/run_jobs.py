"""``nereus run`` as a user runs it (the CLI as a child process) on a small PPO job, for
mpi/test_run_job.py and ranks/test_run_job_errors.py (the errors found before any rank starts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
