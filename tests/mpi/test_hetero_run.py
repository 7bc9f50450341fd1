"""``nereus run`` on CPU ranks labelled as two vendors (issue 23): generation on one label,
training on the other, every crossing through the host transport, training as on one label.

Runs the CLI as a subprocess (as a user would): two runs of 4 ranks, ~1–2 minutes on 2 cores.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.run_jobs import nereus

from nereus.cluster.transport import CROSS_VENDOR

pytestmark = pytest.mark.skipif(shutil.which("mpiexec") is None,
                                reason="needs mpiexec (the mpi extra)")

JOB = """
job: {algorithm: grpo, mode: async, global_batch: 4, samples_per_prompt: 2, minibatches: 2,
      prompt_len: 8, gen_len: 12, reward_model: true}
models: {actor: tiny-gpt, reference: tiny-gpt, reward: tiny-gpt}
"""
# Two node groups of CPU ranks playing NVIDIA and AMD GPUs. Their cost-model speeds differ (the
# "nvidia" label computes faster, the "amd" one reads memory faster), so the vendor-aware planner
# puts generation (decode: memory-bound) on one label and training on the other.
LABELLED = """
cluster:
  gpus_per_node: 2
  nodes:
    - {count: 1, gpu: cpu, vendor: nvidia, memory_per_gpu_gb: 0.5, peak_tflops: 1.0}
    - {count: 1, gpu: cpu, vendor: amd, memory_per_gpu_gb: 0.5, hbm_gbps: 1000}
"""
ONE_LABEL = "cluster: {nodes: 2, gpus_per_node: 2, gpu: cpu, memory_per_gpu_gb: 0.5}\n"
ADAM_LR = 1e-3


def _run(tmp: Path, name: str, cluster: str, runtime: str) -> dict[str, Any]:
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(JOB + cluster + "runtime: " + runtime % (tmp / f"{name}.npz") + "\n")
    res = nereus("run", str(cfg), "--log", str(tmp / f"{name}.h5"), "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def _same_groups_on_gpus(cfg: Path, placements: list[dict[str, Any]],
                         plans: list[dict[str, Any]]) -> None:
    """On CPU ranks every group is ``host`` whatever the labels, so the log above cannot tell
    whether the vendor rule holds. The run's own transition (re-planned from its logged plans:
    the same primitives, hence the same pairs of ranks) on the run's placements made real —
    each rank on a GPU of its label's vendor — through the runtime's chooser: every pair and
    every primitive's group within one vendor takes the device transport, across vendors the
    staged host one; this transition has pairs that cross."""
    from nereus.cluster.devices import cpu_choice
    from nereus.cluster.transport import DEVICE, HOST, RankPlacement
    from nereus.config.load import load_config
    from nereus.config.run import parse_runtime
    from nereus.runtime.execution.device import RankDevice
    from nereus.spec.plan import ExecutionPlan
    from nereus.transition import plan_transition

    on_gpus = tuple(RankPlacement(p["rank"], p["node"], "cuda", p["vendor"],
                                  f"{p['vendor']}:{p['rank']}")
                    for p in sorted(placements, key=lambda p: p["rank"]))
    vendor = {p.rank: p.vendor for p in on_gpus}
    dev = RankDevice(cpu_choice("re-checking the run's groups"), on_gpus, 0)
    loaded = load_config(str(cfg))
    _, setup = parse_runtime(loaded.section("runtime"), loaded.setup, ranks=len(on_gpus))
    planned = plan_transition(setup, ExecutionPlan.from_dict(plans[0]),
                              ExecutionPlan.from_dict(plans[1]))
    kinds = set()
    for p in planned.dag.primitives:
        pairs = {(a, b) for a, b, _ in p.flows if a != b}
        for a, b in pairs:
            assert dev.transport((a, b)) == (DEVICE if vendor[a] == vendor[b] else HOST), (p, a, b)
        members = {g for pair in pairs for g in pair}
        if members:
            one = len({vendor[g] for g in members}) == 1
            assert dev.transport(members) == (DEVICE if one else HOST), p
            assert dev.label(members).endswith(CROSS_VENDOR) == (not one), p
            kinds.add(one)
    assert False in kinds, "the run's transition moves state between the labels"


def _labels_of(plan: dict[str, Any], vendor: dict[int, str]) -> dict[str, set[str]]:
    return {sp["name"]: {vendor[g] for rep in sp["replicas"] for g in rep}
            for sp in plan["stages"]}


@pytest.mark.timeout(900)
def test_generation_and_training_on_two_labels_cross_through_the_host_transport(
        tmp_path: Path) -> None:
    """Labelled run: 3 steps, a forced transition after step 0 (actor-train to tp=1 pp=1, which
    moves it to the other label and generation to the first). Reference: the same job on one
    label, its plan kept. Same seed → same samples, rewards and lengths; losses and final
    parameters up to reduction order (tolerances of tests/mpi/test_run_job.py)."""
    hetero = _run(tmp_path, "hetero", LABELLED, "{steps: 3, reward: model, save_state: %s, "
                  "force_transitions: [{at_step: 0, layouts: {actor-train: [1, 1]}}]}")
    ref = _run(tmp_path, "ref", ONE_LABEL, "{steps: 3, reward: model, adapt: false, "
               "save_state: %s}")
    from nereus.log.reader import read_run_log

    run = read_run_log(tmp_path / "hetero.h5")
    events = list(zip(run.events["kind"], run.events["detail"], strict=True))
    (placements,) = [d["placements"] for k, d in events if k == "devices"]
    vendor = {p["rank"]: p["vendor"] for p in placements}
    assert vendor == {0: "nvidia", 1: "nvidia", 2: "amd", 3: "amd"}
    assert all(p["kind"] == "cpu" for p in placements)
    # Generation on one label, training on the other, before and after the transition.
    dags = run.tables["transitions"]["dag"]
    plans = [run.initial_plan, *run.tables["transitions"]["plan"]]
    assert len(plans) == 2 and hetero["transitions"] == 1
    for plan in plans:
        on = _labels_of(plan, vendor)
        assert len(on["actor-gen"]) == len(on["actor-train"]) == 1, on
        assert on["actor-gen"] != on["actor-train"], on
    assert _labels_of(plans[0], vendor)["actor-gen"] != _labels_of(plans[1], vendor)["actor-gen"]
    # Every step's weight sync crosses the labels, through the host transport only.
    syncs = [d for k, d in events if k == "weight-sync"]
    assert len(syncs) == 3
    for s in syncs:
        assert s["bytes"] > 0 and s["transports"], s
        assert all(name.startswith("host:") and name.endswith(CROSS_VENDOR)
                   for name in s["transports"]), s
    # The transition ran as a DAG on the ranks; its crossing groups went through the host
    # transport (the state moved between labels), and no group used a device transport.
    (dag,) = dags
    assert dag["executor"] == "dag", dag
    crossing = {k: n for k, n in dag["transports"].items() if k.endswith(CROSS_VENDOR)}
    assert crossing and all(k.startswith("host:") for k in crossing), dag["transports"]
    assert not any(k.startswith("device:") for k in dag["transports"]), dag["transports"]
    _same_groups_on_gpus(tmp_path / "hetero.yaml", placements, plans)
    # Each label calibrated on its own model-stages, under its own hardware name.
    assert {str(h) for h in run.tables["efficiencies"]["hardware"]} == {"cpu-nvidia", "cpu-amd"}
    # Training equals the run on one label.
    assert ref["transitions"] == 0
    assert hetero["rewards"] == ref["rewards"] and hetero["lengths"] == ref["lengths"]
    for lr_, lh in zip(ref["losses"], hetero["losses"], strict=True):
        assert set(lr_) == {"actor-train"} and lr_["actor-train"] != 0.0
        assert lh["actor-train"] == pytest.approx(lr_["actor-train"], rel=1e-4, abs=1e-7)
    xr, xh = np.load(tmp_path / "ref.npz"), np.load(tmp_path / "hetero.npz")
    assert set(xr.files) == set(xh.files) and any(k.startswith("actor-train/") for k in xr.files)
    diff2 = ref2 = 0.0
    for k in xr.files:
        d = xh[k].astype(np.float64) - xr[k]
        assert np.abs(d).max() <= 3 * ADAM_LR, k
        diff2 += float((d * d).sum())
        ref2 += float((xr[k].astype(np.float64) ** 2).sum())
    assert diff2 ** 0.5 <= 1e-4 * ref2 ** 0.5
