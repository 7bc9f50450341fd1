"""``nereus run`` on a user's data: a jsonl of prompts, the pattern tokenizer, a reward function
in a file of the user's, validation and TensorBoard (mpi marker: real MPI ranks).

- Every row of the prompt file is taken exactly once per epoch across a forced transition and a
  preemption → resume; the logged per-sample rewards equal the rewards recomputed from the logged
  decoded responses; validation runs when due; the TensorBoard scalars (both segments' event
  files) and the offline wandb run's history read back equal the HDF5 log's.
- A reward function that raises ends a 4-rank run in one line, well within the collective
  timeout.
- Greedy validation gives the same responses on two actor-gen plans (a frozen policy: lr 1e-12
  leaves every fp32 weight as it was).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.paths import REPO
from support.preempt_runs import run_and_signal

pytestmark = pytest.mark.skipif(shutil.which("mpiexec") is None,
                                reason="needs mpiexec (the mpi extra)")

ROWS, VAL_ROWS, BATCH = 24, 8, 8
REWARD = '''
CREDIT_LEN, CREDIT = 64, 0.5


def score(prompt, response, answer, row):
    if row.get("poison"):
        raise ValueError("poisoned row")
    run, matches, running = 0, 0, True
    for i, ch in enumerate(response[:CREDIT_LEN]):
        hit = ch == answer[i % len(answer)]
        matches += hit
        running = running and hit
        run += running
    return CREDIT * (run + matches)
'''


def _job(tmp: Path, runtime: str, poison: int | None = None) -> Path:
    from nereus.rl.task import PatternTask

    for name, seed, n in (("train.jsonl", 5, ROWS), ("val.jsonl", 6, VAL_ROWS)):
        task = PatternTask(seed=seed)
        rows = [{"id": i, "prompt": task.prompt(i), "answer": task.pattern_of(task.prompt(i)),
                 **({"poison": True} if i == poison and name == "train.jsonl" else {})}
                for i in range(n)]
        (tmp / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "score.py").write_text(REWARD)
    cfg = tmp / "job.yaml"
    cfg.write_text(f"""
job: {{algorithm: ppo, mode: sync, global_batch: {BATCH}, minibatches: 2, prompt_len: 8,
      gen_len: 16, reward_model: true}}
models:
  actor: &m {{preset: tiny-gpt, vocab_size: 8}}
  critic: *m
  reference: *m
  reward: *m
cluster: {{nodes: 2, gpus_per_node: 2, gpu: cpu, memory_per_gpu_gb: 0.5}}
data: {{train: train.jsonl, val: val.jsonl, tokenizer: "nereus:pattern", seed: 11}}
reward: {{fn: "score.py:score"}}
runtime: {runtime}
""")
    return cfg


def _rows_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _tensorboard(folder: Path) -> dict[tuple[str, int], float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    out: dict[tuple[str, int], float] = {}
    for events in sorted(folder.glob("events.out.tfevents.*")):  # both segments
        acc = EventAccumulator(str(events), size_guidance={"tensors": 0})
        acc.Reload()
        for tag in acc.Tags()["tensors"]:
            for ev in acc.Tensors(tag):
                out[(tag, ev.step)] = float(tensor_util.make_ndarray(ev.tensor_proto))
    return out


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_rows_rewards_validation_and_tensorboard_through_a_transition_and_a_resume(
        tmp_path: Path) -> None:
    pytest.importorskip("wandb")  # the dev extra installs it (runtime.wandb, offline)
    steps = 7
    cfg = _job(tmp_path, f"""{{steps: {steps}, timeout_s: 60, max_new_tokens: 24, lr: 0.005,
  val_every: 3, log_samples: {BATCH}, tensorboard: {tmp_path / 'tb'},
  wandb: {{project: nereus-test, mode: offline}},
  force_transitions: [{{at_step: 1, layouts: {{actor-gen: [2, 1]}}}}]}}""")
    log = tmp_path / "run.h5"
    code, out = run_and_signal([str(cfg), "--log", str(log)], signal.SIGUSR1, 3)
    assert code == 75, out[-3000:]  # preempted: checkpoint, exit for a requeue
    assert "data.train: 24 prompts of 24 (0 longer than 8 tokens dropped)" in out
    code, out = run_and_signal([str(cfg), "--log", str(log), "--resume"], None, 0)
    assert code == 0, out[-3000:]
    from nereus.config.data import RewardOptions
    from nereus.log.reader import read_run_log
    from nereus.log.scalars import plan_scalars, scalars
    from nereus.log.sinks import log_rows
    from nereus.rl.rewards.loader import load_reward

    run = read_run_log(log)
    assert list(run.steps["step"]) == list(range(steps))  # every step exactly once
    kinds = list(run.events["kind"])
    assert "preempted" in kinds and "restart" in kinds
    assert [d["kind"] for d in run.tables["transitions"]["dag"]][:1] == ["forced"]
    # every row once per epoch, in steps run before and after the transition and the resume
    b = run.tables["batches"]
    assert list(b["step"]) == list(range(steps))
    assert list(b["position"]) == [s * BATCH for s in range(steps)]
    assert list(b["epoch"]) == [s * BATCH // ROWS for s in range(steps)]
    taken = [r for rows in b["rows"] for r in rows]
    for e in range(len(taken) // ROWS):
        assert sorted(taken[e * ROWS:(e + 1) * ROWS]) == list(range(ROWS)), e
    tail = taken[(len(taken) // ROWS) * ROWS:]
    assert len(set(tail)) == len(tail)
    # the logged rewards are reward.fn of the logged decoded responses
    fn = load_reward(RewardOptions("score.py:score"), str(tmp_path))
    train = _rows_of(tmp_path / "train.jsonl")
    s = run.tables["samples"]
    assert len(s["step"]) == steps * BATCH
    for step, seq, row, reward, text in zip(s["step"], s["seq"], s["row"], s["reward"],
                                            s["response"], strict=True):
        r = train[int(row)]
        assert b["rows"][int(step)][int(seq)] == int(row)
        assert fn(r["prompt"], text, r["answer"], r) == reward == b["rewards"][int(step)][seq]
    assert np.allclose(run.steps["reward"], [np.mean(r) for r in b["rewards"]])
    # it learns: 8 samples a step are noisy (seen: 0.94 1.06 0.56 1.06 1.50 1.63 0.94), so the
    # mean of the last three steps against the first three's
    rewards = [float(r) for r in run.steps["reward"]]
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.25, rewards
    # validation after steps 3 and 6 and after the last
    v = run.tables["validation"]
    assert list(v["step"]) == [2, 5, 6] and set(v["prompts"]) == {VAL_ROWS}
    for row in v["detail"]:
        assert len(row["rewards"]) == VAL_ROWS
    assert np.allclose(v["reward"], [np.mean(d["rewards"]) for d in v["detail"]])
    # TensorBoard: every scalar of the log, read back equal (double precision)
    tb = _tensorboard(tmp_path / "tb")
    want = {(tag, st): val for tag, st, val in plan_scalars(run.initial_plan, 0)}
    for table, row in log_rows(run):
        want.update({(tag, st): val for tag, st, val in scalars(table, row)})
    assert want and tb == want
    for step, reward in zip(run.steps["step"], run.steps["reward"], strict=True):
        assert tb[("reward/mean", int(step))] == float(reward)
    assert {("loss/actor-train", 0), ("kl", 0), ("val/pass@1", 2),
            ("calibration/error/actor-gen", 0), ("transition/measured_s", 1)} <= set(tb)
    # wandb (offline): the same scalars, both segments in one run
    from support.wandb_records import history

    runs = sorted(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(runs) == 2 and len({p.name for p in runs}) == 1, runs  # one id, resumed
    logged = {(k, int(row["_step"])): v for path in runs for row in history(path)
              for k, v in row.items() if not k.startswith("_")}
    assert {k for k in logged if logged[k] != want.get(k)} | set(want) - set(logged) == set()
    # a finished log converts to the same scalars
    rep = subprocess.run([sys.executable, "-m", "nereus", "report", "--tensorboard", str(log),
                          str(tmp_path / "tb2")], capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    assert rep.returncode == 0, rep.stderr
    assert _tensorboard(tmp_path / "tb2") == want


@pytest.mark.timeout(900)
def test_a_raising_reward_function_ends_a_4_rank_run_in_one_line(tmp_path: Path) -> None:
    timeout_s = 60
    cfg = _job(tmp_path, f"{{steps: 4, timeout_s: {timeout_s}, max_new_tokens: 16}}", poison=13)
    proc = subprocess.Popen([sys.executable, "-m", "nereus", "run", str(cfg), "--log",
                             str(tmp_path / "run.h5")], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    last = time.monotonic()
    lines = []
    for line in proc.stdout:  # progress lines (row 13 is in the third step), then the error
        lines.append(line)
        if line.startswith("step "):
            last = time.monotonic()
    code = proc.wait(timeout=600)
    ended = time.monotonic()
    errors = [ln for ln in lines if ln.startswith("nereus: error")]
    assert code == 2 and len(errors) == 1, "".join(lines)[-3000:]
    assert "Traceback" not in "".join(lines)
    line = errors[0]
    assert "RewardError: reward.fn='score.py:score' raised ValueError('poisoned row') on " \
           "data.train row 13 (step" in line, line
    assert "step   2/4" in "".join(lines)
    # the third step's scoring failed on one rank's share: every rank ended with it, none
    # waiting for a collective's timeout (the step itself took part of this)
    assert ended - last < timeout_s, ended - last


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_greedy_validation_is_the_same_on_another_generation_plan(tmp_path: Path) -> None:
    cfg = _job(tmp_path, """{steps: 2, timeout_s: 60, max_new_tokens: 24, lr: 1.0e-12,
  val_every: 1, adapt: false, force_transitions: [{at_step: 0, layouts: {actor-gen: [2, 1]}}]}""")
    log = tmp_path / "run.h5"
    code, out = run_and_signal([str(cfg), "--log", str(log)], None, 0)
    assert code == 0, out[-3000:]
    from nereus.log.reader import read_run_log

    run = read_run_log(log)
    plans = [run.initial_plan] + list(run.tables["transitions"]["plan"])
    tps = [next(sp["tp"] for sp in p["stages"] if sp["name"] == "actor-gen") for p in plans]
    assert tps == [1, 2], tps  # step 0 validated on tp 1, step 1 on tp 2
    v = run.tables["validation"]
    assert list(v["step"]) == [0, 1]
    first, second = v["detail"]
    assert first["responses_sha256"] == second["responses_sha256"]
    assert first["rewards"] == second["rewards"] and first["lengths"] == second["lengths"]
