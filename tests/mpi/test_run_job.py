"""``nereus run``: real MPI ranks, Megatron-core models, gloo transfers, HDF5 log (mpi marker).

Runs the CLI as a subprocess (as a user would). Runtime on 2 shared cores: about 2–3 minutes,
most of it the start-up of the ranks (importing torch and megatron-core in every rank).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.run_jobs import GRPO_2_RANKS, GRPO_2_RANKS_BASE, SMALL, nereus, write_job

pytestmark = pytest.mark.skipif(shutil.which("mpiexec") is None,
                                reason="needs mpiexec (the mpi extra)")
ADAM_LR = 1e-3  # runtime.lr default


def test_example_runs_on_4_ranks_and_report_reads_its_log(tmp_path: Path) -> None:
    log = tmp_path / "run.h5"
    res = nereus("run", "examples/ppo-tiny-cpu.yaml", "--ranks", "4", "--steps", "4",
                 "--log", str(log), "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 4 and len(summary["rewards"]) == 4
    assert all(set(loss) == {"actor-train", "critic-train"} for loss in summary["losses"])
    assert all(np.isfinite(v) for loss in summary["losses"] for v in loss.values())
    assert "step   4/4" in res.stderr  # the live progress line (stdout goes to stderr with --json)
    # The pattern task (read as data: its jsonl, tokenizer and reward function) is learned: a
    # random policy already scores (partial credit), and within four PPO steps (lr 0.005, 4
    # updates each) the rewarded responses get longer — seed 0 measured 0.72 → 0.42 → 1.06 →
    # 1.27 reward and 8.6 → 6.9 → 14.4 → 15.2 tokens before the attention masks (issue 30; the
    # test passed after them too); the bound leaves room.
    rewards, lengths = summary["rewards"], summary["lengths"]
    assert 0.1 < rewards[0] < 1.0
    assert rewards[3] > 1.5 * rewards[0] and lengths[3] > 1.5 * lengths[0], (rewards, lengths)
    rep = nereus("report", str(log), "--json", "--no-plots")
    assert rep.returncode == 0, rep.stderr
    data = json.loads(rep.stdout)
    assert data["steps"] == 4 and data["closed"]
    from nereus.log.reader import read_run_log

    run = read_run_log(log)
    assert run.closed and list(run.steps["step"]) == [0, 1, 2, 3]
    assert np.all(run.steps["step_s"] > 0)
    # Live calibration: every step every model-stage's time against its prediction, the samples
    # the calibration took from them, and the refitted efficiencies and fixed costs.
    stages = {sp["name"] for sp in run.initial_plan["stages"]}
    st = run.tables["stage_times"]
    for step in (0, 1, 2, 3):
        assert set(st["model_stage"][st["step"] == step].tolist()) == stages, step
        assert set(run.tables["calibration_samples"]["step"].tolist()) >= {step}
        assert step in set(run.tables["fixed_costs"]["step"].tolist())
    assert np.all(st["predicted_s"] > 0) and np.all(st["measured_s"] > 0)
    assert set(data["stage_time_error"]["per_step_mape_pct"]) == {"0", "1", "2", "3"}


# The ratios are judged over this many runs' transitions: one in the suite (8 ranks for ~1-2 min
# on 2 cores); NEREUS_README_RUNS=3 for the evidence quoted in README and RESULTS.
README_RUNS = int(os.environ.get("NEREUS_README_RUNS", "1"))
# The order of magnitude (0.1-10x) is judged where the 1-minute load average stays at or below
# this during every run (the job's 8 ranks on 2 cores give ~8): at load averages up to 95 from
# other jobs a first gather-and-reload took up to 17.8x its prediction (its rate is still the
# quiet host's default; benchmarks/RESULTS.md, *README job*). Above it the ratios are reported
# and the test is skipped, after every other check has run. The tighter 0.5-2x band held with
# the controller before issue 32 (0.70-1.06 at load 7.7); with the merged controller a first
# gather-and-reload took 3.9x and a one-primitive DAG 0.35x at load 15, so it is not claimed.
ORDER_LOAD = 24.0
NODE1 = frozenset(range(4, 8))


class _LoadSampler:
    """The host's 1-minute load average, sampled every few seconds while a run goes on."""

    def __init__(self, every_s: float = 5.0) -> None:
        import threading

        self.samples = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._every_s = every_s
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> _LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])


def _readme_run(tmp_path: Path, i: int) -> tuple[dict[str, Any], Any, list[float]]:
    from nereus.log.reader import read_run_log

    log = tmp_path / f"readme-{i}.h5"
    with _LoadSampler() as load:
        res = nereus("run", "examples/ppo-tiny-cpu.yaml", "--log", str(log), "--json",
                     timeout_s=1500)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1]), read_run_log(log), load.samples


def _gpus(plan: dict[str, Any]) -> set[int]:
    return {g for sp in plan["stages"] for r in sp["replicas"] for g in r}


def _same_units(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Every model-stage on the same layout and replicas (only the batch split may differ)."""
    def units(p: dict[str, Any]) -> dict[str, Any]:
        return {sp["name"]: (sp["tp"], sp["pp"], [list(r) for r in sp["replicas"]])
                for sp in p["stages"]}
    return units(a) == units(b)


def _check_readme_claims(summary: dict[str, Any], run: Any
                         ) -> tuple[list[tuple[float, float, str, int]], list[str]]:
    """What README.md (*Status*, the main run) states about ``nereus run
    examples/ppo-tiny-cpu.yaml``; returns (measured, predicted, executor, after step) of every
    transition that moved state, and one line per change (for the report)."""
    # the task is learned within the 8 steps: reward 0.73 → 2.47, mean length 8.5 → 38 tokens
    # (the pattern task read as data, issue 31; the prompts' padding masked out of attention,
    # issue 30); sampling does not depend on the plan, so the same in every run
    assert summary["steps"] == 8 and run.closed and list(run.steps["step"]) == list(range(8))
    rewards, lengths = summary["rewards"], summary["lengths"]
    assert round(rewards[0], 2) == 0.73 and rewards[-1] >= 2.46, rewards
    assert round(lengths[0], 1) == 8.5 and lengths[-1] >= 38.0, lengths
    # node 1 leaves after step 4 and returns after step 6; the steps run on its ranks or not
    pools = [(d.get("remove_node"), d.get("add_node"), int(k))
             for k, kind, d in zip(run.events["step"], run.events["kind"], run.events["detail"],
                                   strict=True) if kind == "gpu-pool-change"]
    assert pools == [(1, None, 3), (None, 1, 5)], pools
    assert list(run.steps["pool_gpus"]) == [8, 8, 8, 8, 4, 4, 8, 8]
    rp, adm = run.tables["replans"], run.tables["admissions"]
    trigger = {int(k) + 1: set(str(t).split(",")) for k, t in zip(rp["step"], rp["trigger"],
                                                                   strict=True)}
    admission = {int(k) + 1: (bool(a), str(p)) for k, a, p in zip(
        adm["step"], adm["admitted"], adm["path"], strict=True)}
    reasons = {int(k) + 1: str(r) for k, r in zip(adm["step"], adm["reason"], strict=True)}
    tr = run.tables["transitions"]
    after = [int(k) + 1 for k in tr["step"]]  # "after step N", 1-based as README counts
    plans = [run.initial_plan, *tr["plan"]]
    moved, lines = [], []
    for i, (n, d, prims, nbytes) in enumerate(zip(after, tr["dag"], tr["primitives"],
                                                  tr["transfer_bytes"], strict=True)):
        why, plan = trigger[n], plans[i + 1]
        # every change was admitted on the path its order names, and planned once
        assert admission[n] == (True, d["kind"]) and d["compilations"] == 1, (n, d, admission)
        if d["executor"] == "dag":
            # bytes move only by primitives (a Destroy moves none)
            assert prims or int(nbytes) == 0, (n, prims, nbytes)
        if d["executor"] == "dag" and not prims:  # a new batch split only: nothing moved
            assert _same_units(plans[i], plan), (n, d)
        if n == 4:  # node 1 leaves with every replica of some model-stage: gather-and-reload
            assert d["kind"] == "urgent" and "pool" in why, (n, why)
            assert d["executor"] == "gather-reload" and "every replica of" in d["reason"], d
        elif n == 6:  # node 1 is back: a DAG onto its GPUs, opportunistic where it pays back,
            # urgent where memory runs short too
            assert "pool" in why and (d["kind"] == "opportunistic" or "memory" in why), (n, why)
            assert d["executor"] == "dag" and prims and _gpus(plan) & NODE1, (n, d, plan)
        else:  # the others: a DAG, urgent on memory (the longer responses outgrow the
            # trainers' memory; often a new batch split only) or opportunistic where it pays back
            assert d["executor"] == "dag", (n, d, why)
            assert d["kind"] == "opportunistic" or "memory" in why, (n, d, why)
        if n in (4, 5):  # node 1 is gone
            assert not _gpus(plan) & NODE1, (n, plan)
        phases = " ".join(f"{k} {v:.3f}" for k, v in d.get("phases_max_s", {}).items())
        lines.append(f"after {n}: {d['kind']} {d['executor']} {len(prims)} primitives "
                     f"{float(tr['measured_s'][i]):.3f} s / {float(tr['predicted_s'][i]):.3f} s"
                     + (f" (slowest rank's {phases} s)" if phases else ""))
        if prims or d["executor"] != "dag":
            moved.append((float(tr["measured_s"][i]), float(tr["predicted_s"][i]),
                          d["executor"], n))
    assert 4 in after, after
    if 6 in after:
        assert _gpus(plans[-1]) >= NODE1  # back on node 1 for step 8
    else:  # node 1's return weighed on the opportunistic path and refused as not paying back
        # within gamma*H (its payback measured 0.87 steps in a quiet run, 3.22 on a loaded host)
        assert "pool" in trigger[6] and admission[6] == (False, "opportunistic"), admission
        assert "payback" in reasons[6] and "gamma*H" in reasons[6], reasons[6]
        lines.append(f"after 6: refused: {reasons[6]}")
    # the closed loop: stage times against predictions and refitted fixed costs every step
    assert set(run.tables["stage_times"]["step"].tolist()) == set(range(8))
    assert set(run.tables["fixed_costs"]["step"].tolist()) == set(range(8))
    return moved, lines


@pytest.mark.slow
@pytest.mark.timeout(4800)  # up to three runs of 8 ranks: ~1 min each on 2 quiet cores
def test_the_readme_main_job_as_written(tmp_path: Path) -> None:
    """``nereus run examples/ppo-tiny-cpu.yaml`` exactly as the README runs it, README_RUNS times:
    each run does what README.md says it does (the changes, their triggers and executors, the
    node leaving and returning, the task learned to the stated reward), and every transition
    that moved state took 0.1-10x the time admission weighed for it, on a host not loaded far
    beyond the job's own ranks (``ORDER_LOAD``, judged over the runs)."""
    moved: list[tuple[float, float, str, int]] = []
    loads: list[float] = []
    report: list[str] = []
    for i in range(README_RUNS):
        summary, run, load = _readme_run(tmp_path, i)
        got, lines = _check_readme_claims(summary, run)
        moved += got
        loads += load
        report.append(f"run {i} (load {min(load):.0f}-{max(load):.0f}): " + "; ".join(lines))
    print("\n".join(report))
    ratios = [(round(m / p, 2), ex, n) for m, p, ex, n in moved]
    assert len(ratios) >= README_RUNS, ratios  # at least the change after step 4
    if max(loads) > ORDER_LOAD:
        pytest.skip(f"ratios not judged: 1-minute load average up to {max(loads):.0f} > "
                    f"{ORDER_LOAD:.0f} during the runs (ratios {ratios})")
    assert all(0.1 < r < 10 for r, _, _ in ratios), (report, ratios, loads)


@pytest.mark.slow
@pytest.mark.timeout(1500)  # five runs of 4 ranks, one of 5: ~4 min on 2 idle cores
def test_forced_transitions_and_node_removal_keep_training_semantics(tmp_path: Path) -> None:
    """Baseline: 2 nodes x 2 ranks, the initial plan kept. Forced: a TP change of actor-gen after
    step 0 and TP→DP changes of both trainers after step 1. Removal: 4 nodes x 1 rank, node 3
    leaves after step 0 (urgent DP scale-down). Async removal: 5 nodes x 1 rank, node 0 leaves
    with actor-gen's only replica (rebuilt from actor-train). Same seed → same samples, rewards, losses and
    final parameters up to reduction order: fp32, a different TP splits GEMM sums and a different
    DP sums gradients in another order (relative differences ~1e-7 per op), hence rel 1e-4 on
    losses; sampled tokens (and so rewards and lengths) are identical. Parameters: relative
    difference of the whole state ≤ 1e-4 (measured ~1e-7); per element ≤ 3·lr, since
    Adam's normalized step m/(√v+ε) of an element whose gradient is near ε can differ by up to
    lr per step under a different reduction order (seen: one element in 4096 off by 1.4e-5)."""
    two_by_two = "cluster: {nodes: 2, gpus_per_node: 2"
    async_ppo = "mode: async"  # the trainers change layout; actor-gen has 1 GPU in async plans
    runs = {
        "base": (two_by_two, "{steps: 3, adapt: false, save_state: %s}"),
        "forced": (two_by_two, "{steps: 3, save_state: %s, force_transitions: ["
                   "{at_step: 0, layouts: {actor-gen: [2, 1]}}, "
                   "{at_step: 1, layouts: {actor-train: [1, 1], critic-train: [1, 1]}}]}"),
        "removal": ("cluster: {nodes: 4, gpus_per_node: 1",
                    "{steps: 3, save_state: %s, events: [{at_step: 0, remove_node: 3}]}"),
        "async-base": (two_by_two, "{steps: 3, adapt: false, save_state: %s}"),
        "async-forced": (two_by_two, "{steps: 3, save_state: %s, force_transitions: ["
                         "{at_step: 0, layouts: {actor-train: [1, 1]}}, "
                         "{at_step: 1, layouts: {critic-train: [2, 1]}}]}"),
        # async on 5 single-GPU nodes puts actor-gen alone on node 0 and actor-train on 1-2:
        # node 0 leaving takes actor-gen's only replica, rebuilt from actor-train after the DAG
        "async-removal": ("cluster: {nodes: 5, gpus_per_node: 1",
                          "{steps: 3, save_state: %s, events: [{at_step: 0, remove_node: 0}]}"),
    }
    out = {}
    for name, (cluster, runtime) in runs.items():
        cfg = tmp_path / f"{name}.yaml"
        text = SMALL.replace("cluster: {nodes: 4, gpus_per_node: 1", cluster)
        if name.startswith("async"):
            text = text.replace("mode: sync", async_ppo)
        cfg.write_text(text + "runtime: " + runtime % (tmp_path / f"{name}.npz") + "\n")
        res = nereus("run", str(cfg), "--log", str(tmp_path / f"{name}.h5"), "--json")
        assert res.returncode == 0, res.stderr[-3000:]
        out[name] = json.loads(res.stdout.strip().splitlines()[-1])
    b = out["base"]
    assert b["transitions"] == 0 and len(set(b["plans"])) == 1
    assert out["forced"]["transitions"] == 2 and len(set(out["forced"]["plans"])) == 3
    assert out["removal"]["transitions"] == 1 and len(set(out["removal"]["plans"])) == 2
    from nereus.log.reader import read_run_log

    # The forced changes ran as transition DAGs on the ranks; the removal took critic-inf's and
    # critic-train's only replicas (node 3) with it, so it fell back to gather+reload and says so.
    dags = read_run_log(tmp_path / "forced.h5").tables["transitions"]["dag"]
    assert [d["executor"] for d in dags] == ["dag", "dag"], list(dags)
    # each change planned once, by rank 0, and executed as sent (no rank plans it again)
    assert [d["compilations"] for d in dags] == [1, 1], list(dags)
    (removal,) = read_run_log(tmp_path / "removal.h5").tables["transitions"]["dag"]
    assert removal["executor"] == "dag" or (
        removal["executor"] == "gather-reload" and "every replica of" in removal["reason"]
    ), removal
    assert out["async-forced"]["transitions"] == 2, out["async-forced"]["plans"]
    assert len(set(out["async-forced"]["plans"])) == 3
    # A frozen copy that lost every replica while its source kept one: the DAG of the others,
    # then actor-gen built and filled by the weight sync from actor-train's new units.
    (rebuild,) = read_run_log(tmp_path / "async-removal.h5").tables["transitions"]["dag"]
    assert rebuild["executor"] == "dag" and "actor-gen lost every replica: rebuilt" in (
        rebuild["reason"]), rebuild
    for base, name in (("base", "forced"), ("base", "removal"), ("async-base", "async-forced"),
                       ("async-base", "async-removal")):
        _assert_same_training(tmp_path, out, base, name)
    assert b["losses"][0] != b["losses"][2]  # training moved the models
    _assert_async_is_one_step_off_policy(b, out["async-base"])


def _assert_same_training(tmp_path: Path, out: dict[str, dict[str, Any]], base: str,
                          name: str) -> None:
    """Same samples, rewards and lengths; losses to rel 1e-4; parameters as documented in
    the PPO test."""
    b, m = out[base], out[name]
    assert b["rewards"] == m["rewards"] and b["lengths"] == m["lengths"], name
    for lb, lm in zip(b["losses"], m["losses"], strict=True):
        for k in lb:
            assert lm[k] == pytest.approx(lb[k], rel=1e-4, abs=1e-7), (name, k)
    xb, xm = np.load(tmp_path / f"{base}.npz"), np.load(tmp_path / f"{name}.npz")
    assert any(k.startswith("actor-train/") for k in xb.files)
    assert set(xb.files) == set(xm.files)
    diff2 = ref2 = 0.0
    for k in xb.files:
        d = xm[k].astype(np.float64) - xb[k]
        assert np.abs(d).max() <= 3 * ADAM_LR, (name, k)  # Adam moves ≤ lr per step
        diff2 += float((d * d).sum())
        ref2 += float((xb[k].astype(np.float64) ** 2).sum())
    assert diff2 ** 0.5 <= 1e-4 * ref2 ** 0.5, name


def _assert_async_is_one_step_off_policy(sync: dict[str, Any], asyn: dict[str, Any]) -> None:
    """Step 0 trains the same batch from the same weights in both modes (losses agree up to
    reduction order: the plans differ); from step 1 on async trains batches sampled with the
    weights of one step earlier, so the losses differ."""
    for k, v in sync["losses"][0].items():
        assert asyn["losses"][0][k] == pytest.approx(v, rel=1e-4, abs=1e-7), k
    assert sync["lengths"][0] == asyn["lengths"][0]
    assert all(asyn["losses"][1][k] != pytest.approx(v, rel=1e-3)
               for k, v in sync["losses"][1].items()), (sync["losses"][1], asyn["losses"][1])


def test_rank_failing_at_start_ends_every_rank_with_one_error(tmp_path: Path) -> None:
    cfg = write_job(tmp_path, "fail.yaml", "{steps: 2, inject_failure: {rank: 2, at_step: -1}}")
    t0 = time.monotonic()
    res = nereus("run", str(cfg), "--log", str(tmp_path / "f.h5"), "--timeout-s", "240",
                 timeout_s=300)
    assert res.returncode != 0
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("nereus: error:")]
    assert len(errors) == 1 and "rank 2" in errors[0] and "injected" in errors[0], res.stderr
    assert time.monotonic() - t0 < 240


CRITIC_FREE = """
job: {algorithm: ALGO, mode: MODE, global_batch: 4, samples_per_prompt: N, minibatches: 2,
      prompt_len: 8, gen_len: 12, reward_model: true}
models: {actor: tiny-gpt, reference: tiny-gpt, reward: tiny-gpt}
cluster: {nodes: 1, gpus_per_node: GPUS, gpu: cpu, memory_per_gpu_gb: 0.5}
"""


@pytest.mark.slow
@pytest.mark.timeout(1200)  # four runs of 2 and 4 ranks
@pytest.mark.parametrize(("algo", "n"), [("grpo", 2), ("remax", 1)])
def test_critic_free_algorithms_keep_semantics_across_a_forced_transition(
        tmp_path: Path, algo: str, n: int, request: pytest.FixtureRequest) -> None:
    """GRPO (group of 2) and ReMax (greedy baseline). Sync on 2 ranks: actor-train and
    actor-gen switch between tp=2 and dp=2 after step 0. Async on 4 ranks (actor-gen needs GPUs
    of its own beside the inference lane): actor-gen goes to tp=2 after step 0, actor-train to
    tp=1 (dp 2) after step 1; the batch generated ahead crosses both transitions. Same
    tolerances as the PPO test. The reward is the reward model's score: the task reward of an
    untrained tiny-gpt (128-token vocabulary, 5 of them letters) is 0 almost everywhere, which
    makes advantages 0 and lets Adam blow reduction-order noise (~1e-11 gradients) up to full
    lr-sized steps — a degenerate case, not a semantics check. GRPO's sync base run is the job
    of test_engines_pipeline_run.py's base: the session runs it once
    (support.run_jobs.grpo_two_rank_base)."""
    out: dict[str, dict[str, Any]] = {}
    npz = {name: tmp_path / f"{name}.npz" for name in ("base", "forced", "async-base",
                                                        "async-forced")}
    runs = (
        ("base", "sync", 2, GRPO_2_RANKS_BASE),
        ("forced", "sync", 2, "{steps: 2, adapt: false, reward: model, save_state: %s, "
         "force_transitions: [{at_step: 0, layouts: {actor-train: [TP, 1], actor-gen: [TP, 1]}}]}"),
        ("async-base", "async", 4, "{steps: 3, adapt: false, reward: model, save_state: %s}"),
        ("async-forced", "async", 4, "{steps: 3, adapt: false, reward: model, save_state: %s, "
         "force_transitions: [{at_step: 0, layouts: {actor-gen: [2, 1]}}, "
         "{at_step: 1, layouts: {actor-train: [1, 1]}}]}"),
    )
    for name, mode, gpus, runtime in runs:
        cfg = tmp_path / f"{name}.yaml"
        text = (CRITIC_FREE.replace("ALGO", algo).replace("N", str(n)).replace("MODE", mode)
                .replace("GPUS", str(gpus)))
        if name == "base" and text == GRPO_2_RANKS:  # the session's run of this very job
            out[name], npz[name] = request.getfixturevalue("grpo_two_rank_base")
            continue
        cfg.write_text(text + "runtime: " + runtime % npz[name] + "\n")
        if name == "forced":  # the other layout than the baseline's initial one
            tp = 1 if out["base"]["plans"][0].split()[-1].endswith(".2.1") else 2
            cfg.write_text(cfg.read_text().replace("TP", str(tp)))
        res = nereus("run", str(cfg), "--log", str(tmp_path / f"{name}.h5"), "--json")
        assert res.returncode == 0, res.stderr[-3000:]
        out[name] = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["forced"]["transitions"] == 1, out["forced"]["plans"]
    assert out["async-forced"]["transitions"] == 2, out["async-forced"]["plans"]
    assert len(set(out["async-forced"]["plans"])) == 3
    for base, name in (("base", "forced"), ("async-base", "async-forced")):
        b, m = out[base], out[name]
        assert b["lengths"] == m["lengths"]
        assert m["rewards"] == pytest.approx(b["rewards"], rel=1e-5, abs=1e-7)
        for lb, lm in zip(b["losses"], m["losses"], strict=True):
            assert set(lb) == {"actor-train"} and lb["actor-train"] != 0.0
            assert lm["actor-train"] == pytest.approx(lb["actor-train"], rel=1e-4, abs=1e-7)
        xb, xm = np.load(npz[base]), np.load(npz[name])
        diff2 = sum(float(((xm[k].astype(np.float64) - xb[k]) ** 2).sum()) for k in xb.files)
        ref2 = sum(float((xb[k].astype(np.float64) ** 2).sum()) for k in xb.files)
        assert diff2 ** 0.5 <= 1e-4 * ref2 ** 0.5, name
    _assert_async_is_one_step_off_policy(out["base"], out["async-base"])


OOM = """
job: {algorithm: grpo, mode: sync, global_batch: 4, samples_per_prompt: 2, minibatches: 1,
      prompt_len: 8, gen_len: 8, reward_model: false}
models: {actor: {preset: tiny-gpt, vocab_size: 8}, reference: {preset: tiny-gpt, vocab_size: 8}}
cluster: {nodes: 1, gpus_per_node: 2, gpu: cpu, memory_per_gpu_gb: 0.5}
controller: {memory_headroom: 0.01}
runtime: {steps: 3, max_new_tokens: 16, capacity_drop: {at_step: 1, memory_per_rank_gb: 0.077}}
data: {train: train.jsonl, tokenizer: "nereus:pattern"}
reward: {fn: "nereus:pattern/reward.py:pattern_reward"}
"""
# The pattern task's prompts planned at 8 tokens (7 letters and the colon): the memory this test
# balances (77.7 MB held against 77.0 MB offered) is that of 8-token prompts, at which the
# planner starts actor-train at dp 2; the task's own prompts (at most 5 tokens) start it at tp 2.
OOM_PROMPTS = ["abcdeab:", "bcdeabc:", "cdeabcd:", "deabcde:", "eabcdea:", "aabbcce:"]


def test_capacity_drop_is_an_oom_the_controller_handles_on_the_urgent_path(
        tmp_path: Path) -> None:
    """GRPO on 2 ranks (actor-gen, ref-inf, actor-train on both, dp 2). Each rank holds
    77.7 MB by its account — 67.1 MB the planner's workspace reserve plus 10.6 MB of real
    fp32 tensors (three models, Adam state, KV cache) — where the planner predicted 72.0 MB.
    From step 1 on the devices offer 77.0 MB: the account sees real bytes over the capacity,
    the OOM events tell rank 0 the new capacity and the measured/predicted ratio (1.08), the
    current plan is then infeasible and the urgent path moves actor-train to a layout that
    splits its state (pp or tp 2; real bytes ~72.5 MB) — and step 2 runs with no OOM."""
    cfg = tmp_path / "oom.yaml"
    cfg.write_text(OOM)
    (tmp_path / "train.jsonl").write_text("".join(
        json.dumps({"prompt": p, "answer": p[:-1]}) + "\n" for p in OOM_PROMPTS))
    log = tmp_path / "oom.h5"
    res = nereus("run", str(cfg), "--log", str(log), "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["transitions"] == 1, summary["plans"]
    assert summary["plans"][1] == summary["plans"][0] != summary["plans"][2]
    assert "aT2.1.1" in summary["plans"][0] and "aT1." in summary["plans"][2]
    from nereus.log.reader import read_run_log

    run = read_run_log(log)
    ev = run.events
    ooms = [(int(s), d) for s, k, d in zip(ev["step"], ev["kind"], ev["detail"], strict=True)
            if k == "oom"]
    assert ooms and {s for s, _ in ooms} == {1}  # only in the step of the drop
    assert {d["global_rank"] for _, d in ooms} == {0, 1}
    assert all(d["capacity_bytes"] == 77_000_000 < d["peak_bytes"] for _, d in ooms)
    assert "capacity-change" in list(ev["kind"])
    adm = run.tables["admissions"]
    assert list(adm["step"]) == [1] and list(adm["path"]) == ["urgent"] and adm["admitted"][0]
    # the admitted change was planned once; the log's prediction is admission's own L̂_tran
    (change,) = run.tables["transitions"]["dag"]
    assert change["compilations"] == 1, change
    assert run.tables["transitions"]["predicted_s"][0] == adm["transition_s"][0]
    mem = run.tables["gpu_memory"]
    last = [int(b) for s, b in zip(mem["step"], mem["peak_bytes"], strict=True) if s == 2]
    assert last and max(last) <= 77_000_000  # the new plan fits the smaller devices
