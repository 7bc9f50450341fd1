"""Uneven DP and uneven pipelines executed by ``nereus run`` (issue 37; mpi marker).

One PPO job on 4 virtual nodes of 1 CPU rank: 16 prompts, 2 minibatches of 8 sequences, an
actor and reference of 5 layers (so pp = 3 takes Megatron's uneven split: 2, 2, 1 layers).

- **base**: the initial plan kept (``adapt: false``).
- **forced**: after step 0 actor-gen and actor-train move to dp = 3 (16 sequences as 6 + 5 + 5,
  each update's 8 as 3 + 3 + 2: uneven DP); after step 1 actor-train moves to one unit of
  pp = 3 (uneven PP); after step 2 every model-stage goes back to the base layouts. Every
  change runs as a transition DAG.
- **loss**: node 3 dies (SIGKILL under ULFM) 0.3 s into step 1; the survivors rebuild from the
  replicas left and the urgent replan runs actor-gen on its 3 surviving replicas, dp = 3 over
  the same 16 sequences (6 + 5 + 5: uneven DP, the global batch kept).

Same seed → same samples under any plan, so both runs must train as the base does within the
run-job tolerance (``support.failure_runs.same_training``: sampled tokens, rewards and lengths
identical; losses to rel 1e-4; the whole state to rel 1e-4, each element within 3·lr). A
replica's loss is its tokens' sum over the minibatch's token count, so summing gradients over
replicas of unequal shares weights them by their tokens: the even step up to reduction order.
Runtime on 2 shared cores: three runs of 4 ranks, 6–10 minutes (start-up dominates).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.failure_runs import failure_events, same_training, summary

pytestmark = [pytest.mark.skipif(shutil.which("mpiexec") is None,
                                 reason="needs mpiexec (the mpi extra)"),
              pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
JOB = """
job: {algorithm: ppo, mode: sync, global_batch: 16, minibatches: 2, prompt_len: 8, gen_len: 16,
      reward_model: false}
models: {actor: {preset: tiny-gpt, num_layers: 5}, critic: tiny-gpt,
         reference: {preset: tiny-gpt, num_layers: 5}}
cluster: {nodes: 4, gpus_per_node: 1, gpu: cpu, memory_per_gpu_gb: 0.5}
"""
STEPS = 4


def run(tmp: Path, name: str, runtime: str, timeout_s: float = 900.0) -> dict[str, Any]:
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(JOB + f"runtime: {{steps: {STEPS}, timeout_s: 60, "
                   f"save_state: {tmp / f'{name}.npz'}, {runtime}}}\n")
    res = subprocess.run([sys.executable, "-m", "nereus", "run", str(cfg), "--log",
                          str(tmp / f"{name}.h5"), "--json", "--timeout-s", str(timeout_s)],
                         capture_output=True, text=True, timeout=timeout_s + 60, cwd=ROOT)
    return summary(res)


def stages(label: str) -> dict[str, tuple[int, int, int]]:
    """``plan_label`` (``gen3.1.1 ...``: dp.tp.pp per model-stage) as {short name: (dp, tp, pp)}."""
    out = {}
    for part in label.split():
        name = part.rstrip("0123456789.")
        dp, tp, pp = (int(x) for x in part[len(name):].split("."))
        out[name] = (dp, tp, pp)
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("base")
    return tmp, run(tmp, "base", "adapt: false")


@pytest.mark.timeout(1500)
def test_forced_uneven_dp_and_uneven_pp_and_back_train_as_the_even_run(
        tmp_path: Path, base: tuple[Path, dict[str, Any]]) -> None:
    btmp, b = base
    plan0 = stages(b["plans"][0])
    back = {n: list(plan0[s][1:]) + [plan0[s][0]] for n, s in
            (("actor-gen", "gen"), ("ref-inf", "ref"), ("critic-inf", "cri"),
             ("actor-train", "aT"), ("critic-train", "cT"))}
    out = run(tmp_path, "forced", "force_transitions: ["
              "{at_step: 0, layouts: {actor-gen: [1, 1, 3], actor-train: [1, 1, 3]}}, "
              "{at_step: 1, layouts: {actor-train: [1, 3, 1]}}, "
              f"{{at_step: 2, layouts: {json.dumps(back)}}}]")
    plans = [stages(p) for p in out["plans"]]
    assert plans[1]["gen"] == (3, 1, 1) and plans[1]["aT"] == (3, 1, 1), out["plans"]
    assert plans[2]["aT"] == (1, 1, 3), out["plans"]  # 5 layers on 3 stages: 2, 2, 1
    assert plans[3] == plan0, out["plans"]
    from nereus.log.reader import read_run_log

    dags = read_run_log(tmp_path / "forced.h5").tables["transitions"]["dag"]
    assert [d["executor"] for d in dags] == ["dag"] * 3, list(dags)
    same_training(b, out, np.load(btmp / "base.npz"), np.load(tmp_path / "forced.npz"))


@pytest.mark.timeout(1500)
def test_node_loss_leaves_three_of_four_replicas_on_uneven_dp(
        tmp_path: Path, base: tuple[Path, dict[str, Any]]) -> None:
    btmp, b = base
    assert stages(b["plans"][0])["gen"][0] == 4  # actor-gen: a replica on every node
    out = run(tmp_path, "loss",
              "failures: {checkpoint_every: 1, kill: [{node: 3, at_step: 1, after_s: 0.3}]}")
    (ev,) = failure_events(tmp_path / "loss.h5")
    assert ev["lost_ranks"] == [3] and ev["restored_from"] == "replicas", ev
    assert ev["steps_lost"] == 0
    after = stages(out["plans"][-1])
    assert after["gen"] == (3, 1, 1), out["plans"]  # 3 of 4 replicas: 6 + 5 + 5 prompts
    assert all(dp * tp * pp <= 3 for dp, tp, pp in after.values())
    # the global batch kept: the same 16 sequences every step (rewards and mean lengths of
    # the whole batch equal the base's), and the same training
    same_training(b, out, np.load(btmp / "base.npz"), np.load(tmp_path / "loss.npz"))
